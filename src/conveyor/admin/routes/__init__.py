"""One router module per admin resource."""
