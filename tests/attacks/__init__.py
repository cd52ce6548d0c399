"""HTTP/2 attacks against a real `meshbridge serve`: test_attacks.py (what the server
must withstand). The attacking process, the measured run and the budgets are in
testkit/attacks/ (bench/attacks.py runs the same suite as a table)."""
