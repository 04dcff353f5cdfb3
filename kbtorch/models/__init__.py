"""Model definitions in plain torch (run them on CPU or move them to "ahbm")."""
