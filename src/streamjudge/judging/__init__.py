"""What happens to finished spans: the judge span processor, the judge pool, the judges and the guard."""
