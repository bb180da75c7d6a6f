# A reward file whose import fails (tests/test_reward.c: the adapter must refuse it at start).
import a_module_that_does_not_exist  # noqa: F401


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0
