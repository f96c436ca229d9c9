"""The foundation: settings, topic names, record models and the semantics that the stream
and the batch job share. It imports nothing of the project."""
