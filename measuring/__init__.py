"""How vmapbench measures: the library under the CLI (vmapbench/), the ASV suite (suite/) and the
dashboard (dashboards/), none of which it imports.

- `timer`: the one interleaved timer (callables timed round by round, alternating), `time_call`
  and `first_call_seconds`;
- `stats`: intervals, ratios, noise floors and verdicts, the one place numbers are compared;
- `counts`: instruction counts of measured regions under valgrind's callgrind;
- `malloc`: the glibc malloc settings of the processes that time code;
- `machine`: the machine's name, under which results and noise floors are stored;
- `sizes`: the size a workload is measured at where one size is;
- `counted`: what the gate and the suite count under callgrind;
- `memory`: a call's memory (torch's allocator peak, CUDA's, RSS growth, XLA's analysis);
- `measurement`: `Measurement`, a table row of one method, and `measure`, which takes one.

It imports no other package of the project: the measured commits' trees the gate extracts hold
engine/ and workloads/ alone, and run with the gate checkout's measuring/.
"""
