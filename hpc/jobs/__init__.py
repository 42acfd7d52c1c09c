"""A job's life from the login node: planning, submitting, tracking, cancelling and renewing the serving, gateway and build jobs."""
