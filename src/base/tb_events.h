/* moerl — TensorBoard event files: scalar summaries written without TensorFlow.
 *
 * An event file is a sequence of TFRecords, each
 *     uint64 length (little-endian) | uint32 masked CRC32C of those 8 bytes | data | uint32 masked CRC32C of data
 * with CRC32C the Castagnoli CRC (reflected polynomial 0x82F63B78) and mask(c) = ((c >> 15) | (c << 17)) +
 * 0xa282ead8 (mod 2^32). Each record's data is a serialized tensorflow.Event protocol buffer
 * (tensorflow/core/util/event.proto), encoded here by hand:
 *     Event       { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5;
 *                   SessionLog session_log = 7; }
 *     Summary     { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; }
 *     SessionLog  { enum status = 1 (START = 1); }
 * The first record is {wall_time, file_version: "brain.Event:2"}, as TensorBoard expects. Sources:
 * the TFRecord format (tensorflow/core/lib/io/record_writer.cc, documented framing) and event.proto /
 * summary.proto field numbers; no code taken.
 *
 * Files are named events.out.tfevents.<unix seconds>.<hostname>.<pid>.<n> (n counts the writers
 * this process opened), as TensorFlow and PyTorch name theirs, so TensorBoard's --logdir finds them.
 * Every call writes whole records with one fwrite and flushes, so a killed process leaves at worst
 * a truncated last record, which TensorBoard's readers skip.
 */
#ifndef MOERL_TB_EVENTS_H
#define MOERL_TB_EVENTS_H

#include <stddef.h>
#include <stdint.h>

typedef struct tb_writer tb_writer;

/* CRC32C (Castagnoli) of n bytes, and its TFRecord mask. Exposed for tests. */
uint32_t tb_crc32c(const void *data, size_t n);
uint32_t tb_masked_crc32c(const void *data, size_t n);

/* Create `dir` (and parents) and a new event file in it; write the file_version record. When
 * restart_step ≥ 0 (a resumed run), also write a SessionLog START event at that step, which tells
 * TensorBoard to drop the steps ≥ restart_step that earlier files of the folder hold (a run that
 * went past its checkpoint before it stopped). NULL on error with moerl_last_error() naming the
 * path and the reason. */
tb_writer *tb_open(const char *dir, int64_t restart_step);

/* One Event at `step` (wall_time: seconds since the epoch) holding a Summary with a simple_value
 * per key (values rounded to float32, as simple_value is a float; NaN and ±inf are kept). Flushed.
 * Error: a write failure (named with the path). */
int tb_write_scalars(tb_writer *w, int64_t step, double wall_time, int n, const char *const keys[],
                     const double values[]);

/* The event file's path (owned by the writer). */
const char *tb_path(const tb_writer *w);

/* Flush and close (NULL is fine). */
void tb_close(tb_writer *w);

#endif
