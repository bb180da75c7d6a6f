/* moerl — the countdown task's equation checker: an exact arithmetic-expression evaluator.
 *
 * The countdown task (TinyZero; verl/utils/reward_score/countdown.py) gives a few numbers and a
 * target; an answer is an equation over those numbers with + - * / and parentheses. moerl checks it
 * exactly: rational arithmetic, each number usable at most as often as it is given (reward_countdown
 * in data/rewards.h builds on this). */
#ifndef MOERL_EXPR_H
#define MOERL_EXPR_H

#include <stdint.h>

typedef enum {
    CD_VALID = 0,
    CD_SYNTAX,            /* not an expression of integers, + - * / and parentheses */
    CD_NUMBER_NOT_GIVEN,  /* a literal that is not among the numbers */
    CD_NUMBER_REUSED,     /* a number used more times than it is given */
    CD_DIV_BY_ZERO,
    CD_OVERFLOW,          /* an intermediate beyond 64-bit rationals */
    CD_WRONG_RESULT,      /* valid, but not equal to the target (or "= N" with N not the target) */
} cd_verdict;

/* Check `equation` (an expression, optionally followed by "= <target>") against the given numbers
 * (numbers[0..n_numbers), a multiset: each may be used at most as often as it appears) and target.
 * Parsing is recursive descent (expr := term {(+|-) term}, term := unary {(*|/) unary},
 * unary := -unary | primary, primary := integer | (expr)); spaces and tabs are skipped; nesting
 * deeper than 200 is a syntax error; a decimal literal ("1.5") is a syntax error; a literal above
 * 10^15 is an overflow (it cannot be a given number). Evaluation is exact rational arithmetic
 * (int64 numerator and denominator, reduced), so non-integer intermediates such as 8/3*3 are exact.
 * Precedence of verdicts: syntax, numbers, division by zero, overflow, result. Never fails
 * otherwise (any NUL-terminated text is a valid input). */
cd_verdict countdown_verify(const char *equation, const int64_t *numbers, int n_numbers, int64_t target);

/* A short English name of a verdict ("valid", "syntax error", ...); "?" for a value outside the enum. */
const char *cd_verdict_name(cd_verdict v);

#endif
