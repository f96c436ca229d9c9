"""Settings for every test process.

Every JVM the tests start (Kafka nodes and their tools, Spark's driver, master, workers
and executors) compiles with the client compiler only. A test's JVM lives for seconds or
minutes, where C2's compiling costs more CPU than its faster code saves: a test broker
starts with about half the CPU. ``make bench`` and ``make chaos`` start theirs with the
JVM's defaults, as a deployment would.
"""

from __future__ import annotations

import os

#: Read by every ``java`` launcher of JDK 9 and later (each prints a note that it did).
os.environ.setdefault("JDK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1")
