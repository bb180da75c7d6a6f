# A verl-style reward file for tests/test_reward.c (reward.custom_reward_function.path): the
# signature verl's reward managers call, returning a float for one data_source and a dict with
# score, acc and pred (verl's reward_extra_info shape) for another.


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if data_source == "plain":
        return 1.0 if str(ground_truth) in solution_str else 0.0
    if data_source == "rich":
        words = solution_str.split()
        pred = words[-1] if words else ""
        acc = pred == str(ground_truth)
        return {"score": 1.0 if acc else -0.5, "acc": acc, "pred": pred, "length": len(solution_str)}
    if data_source == "extra":
        # ground_truth as a JSON value, extra_info passed through
        return float(ground_truth["target"]) * float(extra_info["weight"])
    if data_source == "noisy":
        print("a reward function that prints: this must not reach the answers")
        return 0.25
    if data_source == "nan":
        return float("nan")
    if data_source == "boom":
        raise ValueError("cannot score this row")
    return 0.0


def other_score(data_source, solution_str, ground_truth, extra_info=None):
    return 7.0
