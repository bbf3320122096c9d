"""Does the math_verify sandbox decide a comparison after a timeout when the machine is loaded? `--busy` Python
processes spin beside it while `--rounds` rounds run 07b_math_verify's check: three `is_correct` calls on two threads,
the first (`{{{{{{{{{{1}}}}}}}}}}`) overrunning its budget, the third (`{{1}}` against `1`) needing the replacement
worker. Each round starts from a fresh worker. Prints how many rounds decided the third pair.

    python benchmarks/math_verify_load.py --busy 12 --rounds 10"""
import argparse, subprocess, sys, time
from concurrent.futures import ThreadPoolExecutor

SPIN = "import time\nt = time.time()\nwhile time.time() - t < {s}: sum(i * i for i in range(10000))"

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--busy", type=int, default=12, help="spinning processes beside the checks")
    ap.add_argument("--rounds", type=int, default=10)
    a = ap.parse_args()
    from maxpost.rewards.answers import is_correct
    from maxpost.rewards.sandbox import _worker, warm_math_verify
    if not warm_math_verify(): sys.exit("math_verify is not installed")
    spin = [subprocess.Popen([sys.executable, "-c", SPIN.format(s=600)]) for _ in range(a.busy)]
    try:
        time.sleep(1)
        slow, ok, t0 = "{" * 10 + "1" + "}" * 10, 0, time.perf_counter()
        for _ in range(a.rounds):
            _worker()._kill(); warm_math_verify()                  # a fresh worker, as in a fresh notebook process
            with ThreadPoolExecutor(2) as ex:
                outs = list(ex.map(lambda x: is_correct(x, "1"), [slow, r"\frac{2}{2}", "{{1}}"]))
            ok += outs[2] is True
        print(f"{a.busy} busy processes: {ok} of {a.rounds} rounds decided {{{{1}}}} = 1 "
              f"({time.perf_counter() - t0:.1f} s)")
    finally:
        for p in spin: p.kill()

if __name__ == "__main__":
    main()
