#!/usr/bin/env python3
"""What an engine-bench run's interactive TTFTs are made of, from the engines' own logs.

    python3 test/enginebench/misses.py REPORT_DIR RUN       e.g. artifacts/enginebench/stock prefill

Each interactive request of the run (the access log of every gateway replica, RUN*.gateway.log)
is matched to its llama-server task (llama-N.log of worker llama-N, written with
--log-timestamps), and its TTFT is cut into: usher's own time (queue and dispatch), the wait at
the engine before a slot took the task (the step in progress, or no free slot), the task's
prompt eval, and the rest. It also counts, for each request, the other slots' prefills that
overlapped its own, and whether they began before it, in its step, or during it.

It leans on the bench's shapes: an interactive task is one with I_OUT (16) output tokens and a
short prompt; the engine's clock is set to the gateway's by matching the ends of those tasks to
the requests' ends (searched within 10 s of what the logs' modification times give). Reports what it matched; the rest is left out, not guessed.
"""
import bisect
import collections
import datetime
import glob
import json
import os
import re
import statistics
import sys

INTERACTIVE_OUT = 16  # the bench's I_OUT
TASK_LINE = re.compile(r'(\d+\.\d+\.\d+\.\d+) \S+ slot\s+(\S+): id\s+(\d+) \| task (\d+) \| (.*)')
STAMP = re.compile(r'(\d+\.\d+\.\d+\.\d+) ')
PROMPT_EVAL = re.compile(r'prompt eval time =\s+([\d.]+) ms /\s+(\d+) tokens')
EVAL = re.compile(r'\s eval time =\s+([\d.]+) ms /\s+(\d+) tokens')


def wall(s):
    return datetime.datetime.fromisoformat(s.replace('Z', '+00:00')).timestamp()


def since_start(s):  # llama.cpp's --log-timestamps: minutes.seconds.ms.us since start
    m, sec, ms, us = s.split('.')
    return int(m) * 60 + int(sec) + int(ms) / 1e3 + int(us) / 1e6


def read_engine(path):
    """The tasks of one engine's log, and its clock's offset to the wall clock (first guess)."""
    tasks, last = {}, 0.0
    with open(path, errors='replace') as f:
        for line in f:
            m = STAMP.match(line)
            if m:
                last = since_start(m[1])
            m = TASK_LINE.match(line)
            if not m:
                continue
            t, rest = since_start(m[1]), m[5]
            x = tasks.setdefault(int(m[4]), {'id': int(m[4]), 'slot': int(m[3])})
            if 'processing task' in rest:
                x['launch'] = t
            if p := PROMPT_EVAL.search(rest):
                x['prompt_ms'], x['prompt_tokens'] = float(p[1]), int(p[2])
            if e := EVAL.search(rest):
                x['out'] = int(e[2])
            if m[2] == 'release':
                x['end'] = t
    return [x for x in tasks.values() if 'launch' in x and 'prompt_ms' in x], os.path.getmtime(path) - last


def read_requests(report_dir, run):
    reqs = []
    for path in glob.glob(os.path.join(report_dir, run + '*.gateway.log')):
        with open(path) as f:
            for line in f:
                try:
                    j = json.loads(line)
                except ValueError:
                    continue
                if j.get('msg') == 'request' and j.get('completion_tokens') == INTERACTIVE_OUT and j.get('engine_ttft_ms'):
                    j['end'] = wall(j['time'])
                    j['send'] = j['end'] - j['ms'] / 1e3 + (j['ttft_ms'] - j['engine_ttft_ms']) / 1e3
                    reqs.append(j)
    return reqs


def align(tasks, reqs, offset):
    """The engine clock's offset to the wall clock: of the offsets within 10 s of the first
    guess, the one that ends the most interactive-shaped tasks within 30 ms of a request's end,
    then the median of those gaps."""
    ends = sorted(x['end'] for x in tasks if 'end' in x)
    if not ends or not reqs:
        return offset

    def gaps(off):
        out = []
        for r in reqs:
            i = bisect.bisect_left(ends, r['end'] - off)
            near = [ends[j] for j in (i - 1, i) if 0 <= j < len(ends)]
            g = min((r['end'] - off - e for e in near), key=abs)
            if abs(g) < 0.03:
                out.append(off + g)
        return out

    best = max((offset + k * 0.02 for k in range(-500, 501)), key=lambda off: len(gaps(off)))
    return statistics.median(gaps(best) or [best])


def main():
    report_dir, run = sys.argv[1], sys.argv[2]
    reqs = read_requests(report_dir, run)
    rows = []
    for path in sorted(glob.glob(os.path.join(report_dir, 'llama-*.log'))):
        worker = os.path.basename(path)[:-len('.log')]
        tasks, offset = read_engine(path)
        shaped = sorted((x for x in tasks if x.get('out') == INTERACTIVE_OUT and x['prompt_tokens'] < 200),
                        key=lambda x: x['launch'])
        mine = sorted((r for r in reqs if r['worker'] == worker), key=lambda r: r['send'])
        offset = align(shaped, mine, offset)
        used = set()
        for r in mine:
            near = [x for x in shaped if x['id'] not in used and -0.05 <= x['launch'] + offset - r['send'] < 3.0]
            if not near:
                continue
            x = min(near, key=lambda x: x['launch'])
            used.add(x['id'])
            if r['tenant'] != 'chat' or r.get('ttft_verdict') not in ('met', 'missed'):
                continue
            launch, prefill = x['launch'] + offset, x['prompt_ms'] / 1e3
            beside, when = 0.0, []
            for y in tasks:
                if y['slot'] == x['slot']:
                    continue
                a = y['launch'] + offset
                overlap = min(a + y['prompt_ms'] / 1e3, launch + prefill) - max(a, launch)
                if overlap > 0:
                    beside += overlap
                    d = (y['launch'] - x['launch']) * 1e3
                    when.append('before' if d < -5 else 'same step' if d <= 5 else 'during')
            wait = (launch - r['send']) * 1e3
            rows.append({'verdict': r['ttft_verdict'], 'usher': r['ttft_ms'] - r['engine_ttft_ms'], 'wait': wait,
                         'prompt': x['prompt_ms'], 'rest': r['engine_ttft_ms'] - wait - x['prompt_ms'],
                         'beside': beside * 1e3, 'when': when})
    judged = sum(r.get('tenant') == 'chat' and r.get('ttft_verdict') in ('met', 'missed') for r in reqs)
    print(f'{run}: {len(rows)} of {judged} judged interactive requests matched to their engine tasks')
    for verdict in ('met', 'missed'):
        rr = [r for r in rows if r['verdict'] == verdict]
        if not rr:
            continue
        med = {k: statistics.median(r[k] for r in rr) for k in ('usher', 'wait', 'prompt', 'rest')}
        when = collections.Counter(w for r in rr for w in r['when'])
        print(f"  {verdict} {len(rr)}: median ms usher {med['usher']:.0f}, engine wait {med['wait']:.0f}, "
              f"prompt eval {med['prompt']:.0f}, rest {med['rest']:.0f}; another slot's prefill beside its own: "
              f"{sum(r['beside'] > 1 for r in rr)} (tasks begun {dict(when)})")


if __name__ == '__main__':
    main()
