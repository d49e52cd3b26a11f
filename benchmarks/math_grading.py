"""What grading math answers in a worker process costs, against math-verify in the caller.

Measures, on the same answers in the same run: (1) math-verify called directly (what the
seeds do in a thread, where its own timeouts cannot work), (2) our Grader one answer at a time,
(3) our Grader with a round's answers batched (what a step of episodes does), (4) the
Grader's start-up (fork, import, first parse), which happens once per process, and (5) the
cost of a pathological answer: the time limit plus a worker restart.

    .venv/bin/python benchmarks/math_grading.py [--answers 256] [--timeout 2]
    .venv/bin/python benchmarks/math_grading.py --quick     # 16 answers: a smoke run

The last line is a JSON summary; compare ratios, not seconds, on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

from agentrl.envs.math import arithmetic_problem
from agentrl.envs.math_grader import Grader, _grade_in_worker


def _answers(n: int) -> list[tuple[str, str]]:
    rng = random.Random(0)
    out = []
    for _ in range(n):
        _, gold = arithmetic_problem(rng, 0, 99, 2, "+-*")
        guess = gold if rng.random() < 0.5 else str(int(gold) + rng.randint(1, 9))
        out.append((gold, guess))
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--answers", type=int, default=256)
    p.add_argument("--timeout", type=float, default=2.0)
    p.add_argument("--quick", action="store_true", help="16 answers, for a smoke run")
    a = p.parse_args()
    if a.quick:
        a.answers = 16
    pairs = _answers(a.answers)
    import logging

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    _grade_in_worker("1", "1", True)  # import and warm math-verify here too
    t = time.perf_counter()
    direct = [_grade_in_worker(g, x, True)[0] for g, x in pairs]
    direct_s = time.perf_counter() - t

    grader = Grader()
    try:
        t = time.perf_counter()
        asyncio.run(grader.grade("1", "1", 60.0, True))
        startup_s = time.perf_counter() - t

        async def one_by_one():
            return [(await grader.grade(g, x, a.timeout, True)).correct for g, x in pairs]

        async def batched():
            grades = await asyncio.gather(*(grader.grade(g, x, a.timeout, True) for g, x in pairs))
            return [g.correct for g in grades]

        t = time.perf_counter()
        single = asyncio.run(one_by_one())
        single_s = time.perf_counter() - t
        calls = grader.calls
        t = time.perf_counter()
        batch = asyncio.run(batched())
        batch_s = time.perf_counter() - t
        batch_calls = grader.calls - calls
        t = time.perf_counter()
        hung = asyncio.run(grader.grade("7", "\\boxed{9^{9^{9^{9}}}}", a.timeout, True))
        hung_s = time.perf_counter() - t
        t = time.perf_counter()
        asyncio.run(grader.grade("1", "1", 60.0, True))
        after_hang_s = time.perf_counter() - t
    finally:
        grader.shutdown()
    assert single == direct == batch and hung.timed_out
    n = len(pairs)
    summary = {
        "answers": n, "direct_ms_per_answer": 1e3 * direct_s / n, "pool_ms_per_answer_one_by_one": 1e3 * single_s / n,
        "pool_ms_per_answer_batched": 1e3 * batch_s / n, "batched_worker_calls": batch_calls,
        "one_by_one_over_direct": single_s / direct_s, "batched_over_direct": batch_s / direct_s,
        "startup_s": startup_s, "pathological_s": hung_s, "timeout_s": a.timeout,
        "first_grade_after_restart_s": after_hang_s,
    }
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in summary.items()}))


if __name__ == "__main__":
    main()
