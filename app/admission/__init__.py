"""The HTTP surface: AdmissionReview in, decision out."""
