/* moerl — the agent loop: multi-turn trajectories with tools, driven between engine steps.
 *
 * A trajectory is one gen_request whose output grows turn by turn (rollout/engine.h: out_mask 1 =
 * sampled, 0 = inserted). When an assistant turn ends at a stop token, agent_loop_turn_end decodes
 * that turn's sampled ids, parses its tool calls (rollout.multi_turn.format, data/tool_calls.h) and
 * either ends the trajectory (no call, the assistant-turn limit, the environment said done) or sends
 * the well-formed calls to the environment (reward/env.h) and parks the request; malformed calls are
 * answered at once with the parser's message (a tool error the model sees, as verl's tool agent
 * loop does). Other sequences keep decoding meanwhile. agent_loop_poll, called between engine steps,
 * collects the answers; once every call of a turn is answered, the tool messages (each content cut
 * to max_tool_response_length characters) are rendered by the chat template as the delta after the
 * sampled turn (tool_turn_ids: never re-encoding the sampled ids) and engine_continue queues the
 * request for its next turn — or ends it with finish `length` when the delta leaves no room.
 *
 * Partial rollout: a weight sync may pause the engine while requests are parked here; their calls
 * go on, and when answered they are continued under the new weights (engine_continue re-prefills).
 * Nothing here depends on the weights' version.
 *
 * Layer: rl (uses rollout's engine, data's tokenizer and tool parser, reward's environment client).
 * One thread (the rollouter's) calls everything but agent_loop_take_stats, which another thread may
 * call at any time.
 */
#ifndef MOERL_AGENT_LOOP_H
#define MOERL_AGENT_LOOP_H

#include <stdint.h>

#include "data/dataset.h"
#include "reward/env.h"
#include "rl/multi_turn.h"
#include "rollout/engine.h"

/* What one finished trajectory did (rl_group.traj[j]; the samples log and the metrics read it). */
typedef struct {
    int turns;              /* assistant turns sampled (≥ 1) */
    int tool_calls;         /* tool calls written (well-formed or not) */
    int tool_errors;        /* of which answered with an error: malformed, unknown tool, tool error, timeout */
    int malformed_calls;    /* of which malformed (invalid JSON, no name, unknown tool: the parser's errors) */
    int env_done;           /* the environment ended the episode ("done": true) */
    int has_env_reward;     /* the environment gave the episode's reward ... */
    double env_reward;      /* ... this one: it is the score (no reward function is called for it) */
} agent_traj;

/* Totals since the last agent_loop_take_stats (metrics of one trainer step). */
typedef struct {
    long trajectories;          /* finished */
    long turns_sum;
    int turns_max;
    long tool_calls, tool_errors, tool_timeouts, malformed_calls;
    long answered;              /* environment calls answered (errors and timeouts included) */
    double tool_latency_sum_s, tool_latency_max_s; /* over the answered calls */
    double tool_wait_s;         /* seconds trajectories spent parked waiting for answers, summed (timing_s/tool) */
} agent_stats;

typedef struct agent_loop agent_loop;

/* A loop for m (enable set) whose tools are tc (borrowed, outlives the loop), calls made through a
 * new environment client (env_create: the programs start now), turns rendered by the current
 * tokenizer's chat template (tok_current). NULL with the client's error, or when the template
 * writes none of the tokenizer's stop tokens at the end of an assistant turn (no turn boundary). */
agent_loop *agent_loop_create(const multi_turn_config *m, const tool_config *tc, const env_config *ec);
/* The checks agent_loop_create makes of the current tokenizer's chat template, alone (moerl rl makes
 * them before its warm start): it ends assistant turns with a stop token, renders a tool message into
 * the tool turn's delta (an error naming the template: else the model would never see an answer) and
 * (a warning otherwise) the tools' schemas into the prompt. */
int agent_loop_check_template(const tool_config *tc);
/* Kill the environment programs, free the parked trajectories' state (their requests stay the
 * caller's). */
void agent_loop_free(agent_loop *A);

/* r (of engine e, prompt row `row`, trajectory id `traj_id`, e.g. "UID-J") finished a turn; t is
 * the caller's record for it (zeroed before the first turn). Returns 1 if the trajectory ended (r
 * final: t filled), 0 if r is parked (tool calls in flight) or already queued for its next turn.
 * MOERL_ERR: the environment failed (run must stop), or the chat template cannot render the tool
 * turn (message names the row). A request finished other than FINISH_STOP always ends (returns 1). */
int agent_loop_turn_end(agent_loop *A, engine *e, gen_request *r, agent_traj *t, const ds_row *row,
                        const char *traj_id);
/* Advance the tool calls, waiting up to wait_s for the first answer when nothing else is ready;
 * continue the answered trajectories in e, and put the ones that ended (length limit reached by
 * the tool turn, done) in done[0..cap). Returns their count, or MOERL_ERR (the environment failed:
 * message names the tool, the program or URL and the trajectory). */
int agent_loop_poll(agent_loop *A, engine *e, gen_request **done, int cap, double wait_s);
/* Trajectories parked (waiting for tool answers). */
int agent_loop_waiting(const agent_loop *A);
/* The totals since the last call, then reset (thread-safe against the loop's thread). */
void agent_loop_take_stats(agent_loop *A, agent_stats *out);

/* ---- Simulation mode (moerl simulate, src/sim): the same loop with the decisions drawn ----
 * The trajectories run through the same rollouter paths (finish_requests → agent_loop_turn_end,
 * rollouter_poll_tools → agent_loop_poll → engine_continue), but nothing is parsed and no program
 * runs: each request gets a forced script at its start (agent_loop_sim_script: its assistant turns'
 * lengths drawn, each turn ending with the stop id), a turn that ends before the drawn number of
 * turns "sends" one tool call whose answer comes after a drawn latency on the caller's clock, and
 * an answered trajectory continues with response_tokens filler ids. */
typedef struct {
    double turns_mean;       /* assistant turns per trajectory: 1 + a geometric draw with mean turns_mean − 1 (≥ 1),
                                capped by rollout.multi_turn.max_assistant_turns (the last allowed turn's call is
                                counted, never sent, as on the real path) */
    double latency_median_s; /* a tool call's latency: log-normal with this median (s, > 0) ... */
    double latency_sigma;    /* ... and this σ of its logarithm (≥ 0; 0 = every call takes the median). A latency
                                over rollout.multi_turn.tool_timeout_s is a timeout answered at the timeout */
    int response_tokens;     /* ids inserted per tool turn (the tool message and its template text), ≥ 0 */
    double synth_alpha;      /* each assistant turn's length: Pareto(synth_alpha) above synth_min tokens, ... */
    int synth_min;           /* ... as rollout.synthetic_length draws a single-turn response's (alpha > 0) */
    int eos_id;              /* the stop id ending each scripted turn (the engine's eos_token_id) */
    int filler_id;           /* the id of every other scripted and inserted token (not a stop id) */
} agent_sim_config;

/* A loop in simulation mode for m (enable set; its max_assistant_turns and tool_timeout_s apply) and
 * s (copied), reading virtual seconds from clock(clock_ctx) (sends at the time of the turn's end,
 * answers due at send + latency, timing_s/tool = Σ answer − send). No environment is created, no
 * chat template read. NULL with an error naming the field when s is out of range. */
agent_loop *agent_loop_create_sim(const multi_turn_config *m, const agent_sim_config *s, double (*clock)(void *),
                                  void *clock_ctx);
/* Simulation mode: give r (sp.seed set) its script before engine_add — the drawn turns' ids (each
 * turn filler ids then eos_id) as sp.forced, sp.max_tokens = max_tokens (all turns together, as
 * data.max_response_length bounds them), sp.ignore_eos = 0. The draws come from sp.seed alone (a
 * request's trajectory is reproducible and independent of the batch). The script lives in A until
 * the trajectory ends. Errors: A not in simulation mode, max_tokens ≤ 0. */
int agent_loop_sim_script(agent_loop *A, gen_request *r, int max_tokens);
/* Simulation mode: the clock time of the earliest answer still to come (INFINITY: none). */
double agent_loop_sim_next_answer(const agent_loop *A);

#endif
