"""HTTP/2 attacks against a real `meshbridge serve`, shared by tests/attacks/ and
bench/attacks.py: attackers.py (the attacking process), harness.py (the server, the
good clients, one measured run) and budgets.py (what the server promises each attack)."""
