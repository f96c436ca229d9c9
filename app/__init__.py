"""The composition root: app.main builds the faust App that `faust -A app.main worker`
loads. Nothing in the project imports it.

A worker's process first takes its HTTP port (app/listen.py), so that its peers never
take a restarting worker for a dead one; a worker whose port another process holds
exits at once, saying so. Importing the worker's modules allocates much
and frees almost nothing: in a worker the cyclic collector is off until app.main has been
imported (about a tenth of the import time).
"""

import gc
import os
import sys

from app import listen

#: Whether the collector was on before: app.main turns it back on only then.
COLLECTING = gc.isenabled()
try:
    _RESERVED = listen.reserve(sys.argv, os.environ)
except listen.PortTaken as taken:
    sys.exit(f"streamstate: {taken.strerror}")
if _RESERVED is not None:
    gc.disable()
