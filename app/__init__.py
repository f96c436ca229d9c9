"""The composition root: app.main builds the faust App that `faust -A app.main worker`
loads. Nothing in the project imports it."""
