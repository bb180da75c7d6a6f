/* Fuzz target: the MPI wire formats of the distributed RL job (src/rl/wire.c) — a group message
 * ("MOERLGR1", rollout rank → trainer rank 0) and a train message ("MOERLTB1", trainer rank 0 →
 * trainer rank t), as a malformed or hostile rank could send them. Each input is offered to both
 * decoders (the magic picks one). A decoded message, encoded again, must give back the input
 * bytes exactly (the formats have one encoding per message). */
#include "fuzz_common.h"
#include "rl/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *msg = malloc(size ? size : 1); /* exact size: an over-read is caught */
    if (size) memcpy(msg, data, size);

    rl_group *g = NULL;
    if (rl_group_decode(msg, size, &g) == MOERL_OK) {
        FUZZ_ASSERT(g && g->n >= 1 && g->n_done == g->n, "decoded group");
        void *buf = NULL;
        size_t len = 0;
        FUZZ_ASSERT(rl_group_encode(g, &buf, &len) == MOERL_OK, "re-encoding a decoded group: %s",
                    moerl_last_error());
        FUZZ_ASSERT(len == size && memcmp(buf, msg, size) == 0, "group round trip: %zu bytes in, %zu out", size, len);
        free(buf);
        rl_group_free(g);
    } else {
        fuzz_check_error();
        FUZZ_ASSERT(g == NULL, "failed group decode left a group");
    }

    rl_train_msg m;
    if (rl_train_msg_decode(msg, size, &m) == MOERL_OK) {
        int total = 0;
        for (int b = 0; b < m.n_mb; b++) total += m.mbs[b].n_groups;
        FUZZ_ASSERT(total == m.n_groups, "mini-batches hold %d groups, message %d", total, m.n_groups);
        void *buf = NULL;
        size_t len = 0;
        FUZZ_ASSERT(rl_train_msg_encode(m.cmd, m.version, m.step, m.mbs, m.n_mb, m.groups, &buf, &len) == MOERL_OK,
                    "re-encoding a decoded train message: %s", moerl_last_error());
        FUZZ_ASSERT(len == size && memcmp(buf, msg, size) == 0, "train round trip: %zu bytes in, %zu out", size, len);
        free(buf);
        rl_train_msg_free(&m);
    } else {
        fuzz_check_error();
        FUZZ_ASSERT(m.n_groups == 0 && m.groups == NULL && m.mbs == NULL, "failed train decode left memory");
    }
    free(msg);
    return 0;
}
