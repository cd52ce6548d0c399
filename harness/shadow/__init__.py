"""`meshbridge shadow`: two control planes' answers compared continuously.

`cli` is the command; `targets` what it follows, `sides` the two subscribers, `model`
the comparison and its tracker, `report` the output and summary, `session` one run.
"""
