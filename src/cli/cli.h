/* moerl command-line subcommands. Each returns the process exit code (0 ok, 1 error, 2 usage). */
#ifndef MOERL_CLI_H
#define MOERL_CLI_H
int cmd_score(int argc, char **argv);
int cmd_sft(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_rl(int argc, char **argv);
int cmd_tasks(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_plan(int argc, char **argv);     /* src/cli/plan.c */
int cmd_simulate(int argc, char **argv); /* src/cli/simulate.c */
int cmd_export_gguf(int argc, char **argv);
int cmd_init(int argc, char **argv);
/* Parse "1,5,9" into a heap array of ints. Errors name the offending item. */
int cli_parse_int_list(const char *s, int **out, int *n);
#endif
