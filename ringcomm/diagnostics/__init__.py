"""What explains a failure: the pre-flight fingerprint check and the flight recorder."""
