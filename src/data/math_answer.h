/* moerl — the math-answer verifier: final-answer extraction, normalisation and equivalence.
 *
 * The reward of the MATH-style data sources (data/rewards.h: "math", "lighteval/MATH",
 * "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "math_dapo", ...). The ideas
 * come from verl/utils/reward_score/math.py (Hendrycks MATH's last_boxed_only_string, is_equiv and
 * strip_string) and math_dapo.py ("Answer:" extraction); no code is taken. Rules (docs/math-answers.md
 * says the same for users; tests/ref/gen_math_answers.py implements them again in Python as the
 * test's reference):
 *
 * Extraction from a response, the first rule that yields a non-empty text wins:
 *   1. the last "\boxed" or "\fbox" followed by '{' or a space: "{...}" to the matching brace
 *      (nested braces counted; an unbalanced one yields nothing and falls to rule 2), or after
 *      spaces a "{...}" group, or a run of characters up to whitespace or '$' ("\boxed 5$");
 *   2. the last "####": the rest of its line;
 *   3. the last "answer is" / "answer:" (any case): the rest of its line, cut at the first ". ";
 *   4. the last number (as reward_exact_number: optional '-', digits, ",ddd" groups, ".digits").
 * Normalisation (in this order): drop "\left"/"\right"; "\dfrac", "\tfrac" → "\frac"; drop "\!",
 * "\,", "\;", "\:", "\ ", "\%", "%", "\$", "$", "^{\circ}", "^\circ"; a "\text{..}", "\textbf{..}"
 * or "\mbox{..}" group that ends the answer (but for '.' and spaces) after other text is cut
 * (units: "10\text{ cm}" → "10", repeatedly), the others unwrapped ("\text{(B)}" → "(B)");
 * "A B/C" (integers) → "A\frac{B}{C}" (mixed number); all whitespace removed; trailing '.'
 * dropped; "1,234,567.5" (the whole answer, groups of three) → "1234567.5"; "x=5" (one '=', at most 2 characters before it)
 * → "5"; "\frac12" → "\frac{1}{2}", "\sqrt2" → "\sqrt{2}". Percentages: the sign is dropped, as
 * verl's math.py does (50\% equals 50, not 0.5).
 * Equivalence of two normalised answers: equal text; or both exact rationals of equal value —
 * a rational is [-]D, [-]D/D, [-]\frac{[-]D}{[-]D} or [-]I\frac{I}{I} (mixed) with D a decimal
 * ("3", "0.5", ".5", "2.") and I an integer; numerator and denominator, reduced, must fit in
 * int64 and a decimal may have at most 18 digits (after dropping the fraction's trailing zeros),
 * else it is compared as text; or both lists ("(1,2]", "[a,b]", "1,2": commas outside brackets,
 * at most 64 elements) with the same brackets and the same number of elements, equivalent
 * element by element. Everything else (\sqrt, \pi, expressions) compares
 * as normalised text.
 */
#ifndef MOERL_MATH_ANSWER_H
#define MOERL_MATH_ANSWER_H

#include <stdbool.h>

/* The final answer of a response by the extraction rules above, as written (heap string), or
 * NULL when none of the rules finds one. */
char *math_answer_extract(const char *response);

/* The normalised form of an answer (heap string, never NULL; may be ""). */
char *math_answer_normalize(const char *answer);

/* Whether two normalised answers (math_answer_normalize) are equivalent. */
bool math_answer_equal(const char *a, const char *b);

/* The canonical text of a normalised answer, the vote of maj@N: an exact rational as "p" or
 * "p/q" (reduced, the sign on p), anything else unchanged. Heap string. */
char *math_answer_canonical(const char *normalized);

/* Score a response against a ground truth: *score 1.0 when the extracted answer is equivalent to
 * the ground truth's normalised form, else 0.0. The ground truth may itself hold a "\boxed{}"
 * (its last box is used). pred (may be NULL): the canonical extracted answer, NULL when nothing
 * was extracted. Error: the ground truth is empty after normalisation. */
int math_answer_score(const char *response, const char *ground_truth, double *score, char **pred);

#endif
