"""HTTP/2 attacks against a real `meshbridge serve`: attackers.py (the attacking
process), harness.py (the server, the good clients, one measured run) and
test_attacks.py (what the server must withstand, one budget per attack)."""
