import os
import sys

# Make `silt_bench` importable when pytest runs from the repository root.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
