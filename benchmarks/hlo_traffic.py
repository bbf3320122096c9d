"""HBM traffic of a compiled XLA program, by kind of op: which non-matmul fusions move the most bytes.

    python benchmarks/hlo_traffic.py PROGRAM.hlo [--top 25] [--bw 819e9] [--loop]

PROGRAM.hlo is a compiled module's text (`jax.jit(f).lower(…).compile().as_text()`; for a TPU program compiled
without a chip, see `maxpost.aot`). Each top-level instruction of the entry computation and of every while-loop body
(times the loop's known trip count) is charged the bytes of its operands and its result (an in-place
dynamic-update-slice: twice the slice's inputs; an AllocateBuffer: nothing); a fusion holding a dot or
convolution counts as a matmul, any other fusion as elementwise. Bytes over the chip's HBM bandwidth (v5e: 819 GB/s)
give a lower bound on the time of the memory-bound ops: a profile's time for them can be compared with it.
--loop: count one trip of the entry's largest while loop only (the sampler's decode step, without its prefill). A
gather is charged its whole operand (an embedding lookup: the whole table), an overcount.
"""
from __future__ import annotations
import argparse, collections, re

DT = {"bf16": 2, "f16": 2, "f32": 4, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1, "s64": 8, "f64": 8, "u64": 8,
      "s4": 0.5, "u4": 0.5, "token": 0}
SHAPE = re.compile(r"\b(bf16|f16|f32|s32|u32|s8|u8|pred|s64|f64|u64|s4|u4)\[([\d,]*)\]")
HEAD = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s*(?:\([^)]*\)|\(.*\))?.*\{\s*$")
INST = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([\w\-]+)\((.*?)\)(.*)$")


def nbytes(shape_text: str) -> float:
    "Bytes of every array shape in `shape_text` (a tuple's elements added up)."
    tot = 0.0
    for dt, dims in SHAPE.findall(shape_text):
        n = 1
        for d in filter(None, dims.split(",")): n *= int(d)
        tot += n * DT[dt]
    return tot


def parse(text: str):
    "(computations: name → [(inst, shape, opcode, operands, rest)], entry name)"
    comps, cur, entry = {}, None, None
    for line in text.splitlines():
        if line.rstrip().endswith("{") and " = " not in line.split("{")[0]:
            m = HEAD.match(line)
            if m:
                cur = m.group(1); comps[cur] = []
                if line.lstrip().startswith("ENTRY"): entry = cur
                continue
        if cur is None: continue
        m = INST.match(line)
        if m: comps[cur].append(m.groups())
    return comps, entry


def traffic(text: str):
    comps, entry = parse(text)
    shapes = {i[0]: i[1] for c in comps.values() for i in c}
    has_dot = {n: any(op in ("dot", "convolution") for _, _, op, _, _ in c) for n, c in comps.items()}
    dus = {n: any(op == "dynamic-update-slice" for _, _, op, _, _ in c) for n, c in comps.items()}
    key = lambda t: ["%s[%s]" % m for m in SHAPE.findall(t)]
    rows = collections.Counter(); detail = collections.Counter()

    def walk(comp: str, mult: int):
        for name, shape, op, args, rest in comps.get(comp, []):
            if op == "while":
                body = re.search(r"body=%?([\w.\-]+)", rest)
                n = re.search(r'"known_trip_count":\{"n":"(\d+)"', rest)
                if body: walk(body.group(1), mult * (int(n.group(1)) if n else 1))
                continue
            if op in ("parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "partition-id"):
                continue
            if op in ("call", "conditional"):
                for c in re.findall(r"(?:to_apply|branch_computations=\{|calls)=?%?([\w.\-]+)", rest): walk(c, mult)
                continue
            if op == "custom-call" and "AllocateBuffer" in rest: continue      # an allocation moves no bytes
            ins = [nbytes(shapes.get(a.strip().lstrip("%"), "")) for a in args.split(",") if a.strip()]
            called = re.search(r"calls=%?([\w.\-]+)", rest)
            if op == "dynamic-update-slice" or (called and dus.get(called.group(1))):
                # in place: an operand shaped like an output is that output's buffer, updated by a slice; charge the
                # other operands (read) and as much again (the slices written), and the outputs that are no buffer
                outs = key(shape); names = [a.strip().lstrip("%") for a in args.split(",") if a.strip()]
                bufs = [n for n in names if key(shapes.get(n, "")) and key(shapes.get(n, ""))[0] in outs]
                rest_in = sum(nbytes(shapes.get(n, "")) for n in names if n not in bufs)
                b = 2 * rest_in + sum(nbytes(o) for o in outs if o not in [key(shapes[n])[0] for n in bufs])
            else: b = nbytes(shape) + sum(ins)
            kind = ("matmul" if op in ("dot", "convolution") or (op == "fusion" and called and has_dot.get(called.group(1)))
                    else "custom-call" if op == "custom-call" else "copy/transpose" if op in ("copy", "transpose")
                    else "collective" if op.startswith(("all-", "reduce-scatter", "collective")) else
                    "elementwise fusion" if op == "fusion" else op)
            rows[kind] += b * mult
            detail[(kind, name, shape[:60])] += b * mult
    walk(entry, 1)
    return rows, detail


def loop_only(text: str) -> str:
    "`text` with the entry's largest while-loop body (by instruction count) as the entry: one trip of that loop."
    comps, entry = parse(text)
    bodies = [re.search(r"body=%?([\w.\-]+)", rest).group(1) for _, _, op, _, rest in comps[entry] if op == "while"]
    body = max(bodies, key=lambda b: len(comps.get(b, [])))
    out = []
    for line in text.replace("ENTRY ", "").splitlines():
        m = HEAD.match(line) if line.rstrip().endswith("{") and " = " not in line.split("{")[0] else None
        out.append("ENTRY " + line if m and m.group(1) == body else line)
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hlo"); ap.add_argument("--top", type=int, default=25); ap.add_argument("--bw", type=float, default=819e9)
    ap.add_argument("--loop", action="store_true", help="one trip of the entry's largest while loop (a decode step)")
    a = ap.parse_args()
    text = open(a.hlo).read()
    rows, detail = traffic(loop_only(text) if a.loop else text)
    tot = sum(rows.values())
    print(f"{'kind':24s} {'GiB':>8s} {'ms at bw':>9s} share")
    for k, b in rows.most_common():
        print(f"{k:24s} {b / 2**30:8.2f} {b / a.bw * 1e3:9.2f} {b / tot:5.2f}")
    print(f"\nlargest {a.top} non-matmul ops (bytes moved per step, all loop trips):")
    for (k, name, shape), b in detail.most_common():
        if k == "matmul": continue
        print(f"  {b / 2**20:9.1f} MiB {b / a.bw * 1e3:7.3f} ms  {k:18s} {name:28s} {shape}")
        a.top -= 1
        if a.top <= 0: break


if __name__ == "__main__":
    main()
