"""The composition root: app.main builds the faust App that `faust -A app.main worker`
loads. Nothing in the project imports it.

Importing the worker's modules allocates much and frees almost nothing: the cyclic
collector is off until app.main has been imported (about a tenth of the import time).
"""

import gc

#: Whether the collector was on before: app.main turns it back on only then.
COLLECTING = gc.isenabled()
gc.disable()
