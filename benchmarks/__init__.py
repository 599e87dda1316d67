"""The benchmarks (each module a script: ``python benchmarks/NAME.py --help``).

A regular package, not a namespace one: Opacus's wheels (a test dependency) install top-level
``benchmarks`` and ``examples`` packages of their own into site-packages, and a regular
package there would win over a namespace package here, wherever this folder is on the path.
"""
