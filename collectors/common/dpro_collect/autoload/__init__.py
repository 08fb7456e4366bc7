"""Folder to put on PYTHONPATH (its sitecustomize.py starts the collector named by DPRO_COLLECTOR); a package only so that it ships."""
