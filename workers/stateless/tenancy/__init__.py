"""Tenant fairness for stateless stages: who calls (identity), how much (quotas), what
happens over quota (delay topic or dead letter), and a fair share of each batch."""
