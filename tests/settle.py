"""How long a test waits for something that normally happens within a second (a span's checkpoint to move, a
child source process to start and stop): long enough that only a hang fails it, never a loaded host. A span test
that runs its source in a child process (``source_mode`` "process") starts a fresh interpreter that imports the
source's modules (~0.5 CPU s with a test module); on 2 cores with the suite, benchmarks and other jobs at a load
average of 13-16 (8x oversubscribed) that alone took more than the 5-10 s these tests used to wait (a fresh-clone
``make test`` failed four of them so). The wait ends as soon as the condition holds: a healthy run is not slower."""

SETTLE_S = 120.0
