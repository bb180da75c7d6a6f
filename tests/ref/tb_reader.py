"""An independent reader of TensorBoard event files, for tests/e2e_tensorboard.sh.

Usage: /usr/bin/python3 tests/ref/tb_reader.py check RUN_DIR JSONL TB_DIR
    Reads every events.out.tfevents.* file of TB_DIR (not its subfolders) in name order, checks each
    TFRecord's framing and both masked CRC32Cs, decodes each record as a tensorflow.Event with
    Debian's python3-protobuf (the Event, Summary and SessionLog messages are built at run time from
    a FileDescriptorProto: field numbers of tensorflow/core/util/event.proto and
    tensorflow/core/framework/summary.proto), applies TensorBoard's restart rule (a SessionLog START
    at step s drops the earlier files' events at steps >= s), and compares every (step, tag, value)
    with the JSONL metrics file: each record's values, as float32 (simple_value is a float; JSON null
    stands for a non-finite value). Prints one "ok"/"FAIL" line per check and "N passed, N failed".

The CRC32C here is a bitwise implementation of the Castagnoli polynomial written for this test (the C
side uses a table); the mask is TFRecord's ((c >> 15) | (c << 17)) + 0xa282ead8.
"""
import glob
import json
import math
import os
import struct
import sys

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    return c ^ 0xFFFFFFFF


def masked(c):
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def event_class():
    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="moerl_tb_reader.proto", package="tensorflow", syntax="proto3")
    sl = fdp.message_type.add(name="SessionLog")
    en = sl.enum_type.add(name="SessionStatus")
    for i, n in enumerate(["STATUS_UNSPECIFIED", "START", "STOP", "CHECKPOINT"]):
        en.value.add(name=n, number=i)
    sl.field.add(name="status", number=1, type=F.TYPE_ENUM, type_name=".tensorflow.SessionLog.SessionStatus",
                 label=F.LABEL_OPTIONAL)
    sl.field.add(name="checkpoint_path", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    sl.field.add(name="msg", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    sm = fdp.message_type.add(name="Summary")
    val = sm.nested_type.add(name="Value")
    val.oneof_decl.add(name="value")
    val.field.add(name="tag", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    val.field.add(name="simple_value", number=2, type=F.TYPE_FLOAT, label=F.LABEL_OPTIONAL, oneof_index=0)
    sm.field.add(name="value", number=1, type=F.TYPE_MESSAGE, type_name=".tensorflow.Summary.Value",
                 label=F.LABEL_REPEATED)
    ev = fdp.message_type.add(name="Event")
    ev.oneof_decl.add(name="what")
    ev.field.add(name="wall_time", number=1, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
    ev.field.add(name="step", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    ev.field.add(name="file_version", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL, oneof_index=0)
    ev.field.add(name="summary", number=5, type=F.TYPE_MESSAGE, type_name=".tensorflow.Summary",
                 label=F.LABEL_OPTIONAL, oneof_index=0)
    ev.field.add(name="session_log", number=7, type=F.TYPE_MESSAGE, type_name=".tensorflow.SessionLog",
                 label=F.LABEL_OPTIONAL, oneof_index=0)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    desc = pool.FindMessageTypeByName("tensorflow.Event")
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(desc)
    return message_factory.MessageFactory(pool).GetPrototype(desc)


def read_records(path):
    """The data of every record; raises ValueError naming the offset of a bad one."""
    raw = open(path, "rb").read()
    off, out = 0, []
    while off < len(raw):
        if off + 12 > len(raw):
            raise ValueError("%s: truncated record header at byte %d" % (path, off))
        hdr = raw[off:off + 8]
        (n,) = struct.unpack("<Q", hdr)
        (hcrc,) = struct.unpack("<I", raw[off + 8:off + 12])
        if hcrc != masked(crc32c(hdr)):
            raise ValueError("%s: bad length CRC at byte %d" % (path, off))
        if off + 12 + n + 4 > len(raw):
            raise ValueError("%s: truncated record at byte %d" % (path, off))
        data = raw[off + 12:off + 12 + n]
        (dcrc,) = struct.unpack("<I", raw[off + 12 + n:off + 16 + n])
        if dcrc != masked(crc32c(data)):
            raise ValueError("%s: bad data CRC at byte %d" % (path, off))
        out.append(data)
        off += 16 + n
    return out


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


class Checks:
    def __init__(self):
        self.passed = self.failed = 0

    def check(self, cond, what):
        if cond:
            self.passed += 1
            print("ok   %s" % what)
        else:
            self.failed += 1
            print("FAIL %s" % what)
        return cond


def scalars_of(tb_dir, C):
    """(step, tag, value) of the event files, after TensorBoard's restart rule; and the restart steps."""
    Event = event_class()
    files = sorted(glob.glob(os.path.join(tb_dir, "events.out.tfevents.*")))
    C.check(len(files) > 0, "event files in %s" % tb_dir)
    kept, restarts = [], []
    for path in files:
        name = os.path.basename(path).split(".")
        C.check(len(name) >= 7 and name[3].isdigit() and name[-1].isdigit() and name[-2].isdigit(),
                "file name events.out.tfevents.<secs>.<host>.<pid>.<n>: %s" % os.path.basename(path))
        try:
            recs = read_records(path)
        except ValueError as e:
            C.check(False, str(e))
            continue
        C.check(len(recs) >= 2, "%s: %d records, every CRC right" % (os.path.basename(path), len(recs)))
        events = []
        for r in recs:
            e = Event()
            e.ParseFromString(r)
            events.append(e)
        first = events[0]
        C.check(first.WhichOneof("what") == "file_version" and first.file_version == "brain.Event:2",
                "%s: first record is file_version brain.Event:2" % os.path.basename(path))
        for e in events[1:]:
            if e.WhichOneof("what") == "session_log" and e.session_log.status == 1:
                restarts.append(e.step)
                kept = [x for x in kept if x[0] < e.step]
            elif e.WhichOneof("what") == "summary":
                for v in e.summary.value:
                    if v.WhichOneof("value") != "simple_value":
                        C.check(False, "value %s at step %d is not a simple_value" % (v.tag, e.step))
                    kept.append((e.step, v.tag, v.simple_value))
                if not e.wall_time > 1.5e9:
                    C.check(False, "wall_time %r at step %d is not seconds since the epoch" % (e.wall_time, e.step))
            else:
                C.check(False, "unexpected event kind %s" % e.WhichOneof("what"))
    return kept, restarts


def compare(kept, jsonl, C):
    want = []
    for line in open(jsonl):
        o = json.loads(line)
        step = o.pop("step")
        for k, v in o.items():
            want.append((step, k, v))
    C.check(len(kept) == len(want), "TensorBoard holds %d scalars, %s holds %d" % (len(kept), jsonl, len(want)))
    bad = 0
    for (s1, t1, v1), (s2, t2, v2) in zip(kept, want):
        same = s1 == s2 and t1 == t2 and (
            (v2 is None and not math.isfinite(v1)) or (v2 is not None and v1 == f32(v2)))
        if not same:
            bad += 1
            if bad <= 10:
                print("     mismatch: tensorboard (%d, %s, %r) vs jsonl (%d, %s, %r)" % (s1, t1, v1, s2, t2, v2))
    C.check(bad == 0, "every (step, tag, value) equals the JSONL record's, in order (float32 of the value)")


def main():
    if len(sys.argv) != 5 or sys.argv[1] != "check":
        print(__doc__)
        sys.exit(2)
    C = Checks()
    kept, restarts = scalars_of(sys.argv[4], C)
    compare(kept, sys.argv[3], C)
    print("restarts: %s" % restarts)
    print("%d passed, %d failed" % (C.passed, C.failed))
    sys.exit(1 if C.failed else 0)


if __name__ == "__main__":
    main()
