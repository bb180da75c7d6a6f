#!/bin/sh
# A reward.command in shell for tests/test_reward.c: one answer line per request line — score 1
# when the request's solution_str is exactly the "expected" word (given as $1), else 0 — and the
# argument count (quoting of reward.command: $2 may contain spaces).
while IFS= read -r line; do
    case $line in
    *"\"solution_str\":\"$1\""*) echo "{\"score\": 1, \"args\": $#}" ;;
    *) echo "{\"score\": 0, \"args\": $#}" ;;
    esac
done
