"""Folder to put on PYTHONPATH (its sitecustomize.py auto-enables dpro_torch); a package only so that it ships."""
