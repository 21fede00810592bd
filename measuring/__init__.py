"""How vmapbench measures: the library under the CLI (vmapbench/), the ASV suite (suite/) and the
dashboard (dashboards/), none of which it imports.

- `timer`: the one interleaved timer (callables timed round by round, alternating) and `time_call`;
- `stats`: intervals, ratios, noise floors and verdicts, the one place numbers are compared;
- `counts`: instruction counts of measured regions under valgrind's callgrind;
- `malloc`: the glibc malloc settings of the processes that time code;
- `machine`: the machine's name, under which results and noise floors are stored.
- `sizes`: the size a workload is measured at where one size is;
- `counted`: what the gate and the suite count under callgrind.

A workload's memory per call (`workloads.measure`) stays with the workloads: the regression gate
plants memory into a measured commit's workloads/ through it.
"""
