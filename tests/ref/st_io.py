"""Minimal safetensors reader/writer for the PyTorch reference scripts (Debian's torch has no
`safetensors` package). Format: u64 little-endian header length N, N bytes of JSON header,
then the data buffer. Written from the public format description."""
import json
import struct

import torch

_DT = {torch.float32: ("F32", 4), torch.bfloat16: ("BF16", 2), torch.float16: ("F16", 2),
       torch.float64: ("F64", 8), torch.int64: ("I64", 8), torch.int32: ("I32", 4)}
_RDT = {v[0]: k for k, v in _DT.items()}


def save(tensors, path, metadata=None):
    """tensors: dict name -> torch.Tensor (F32/BF16/F16/I64/I32). Writes in insertion order."""
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        code, size = _DT[t.dtype]
        raw = t.view(torch.uint8).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load(path):
    """Returns dict name -> torch.Tensor."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        dt = _RDT[info["dtype"]]
        buf = bytearray(data[b:e])
        t = torch.frombuffer(buf, dtype=torch.uint8) if len(buf) else torch.zeros(0, dtype=torch.uint8)
        out[name] = t.view(dt).reshape(info["shape"]).clone()
    return out
