"""The figures we publish (docs/design.md, Figures we publish): one program per figure and the wire-cost counter.

May import: every other seedflood package except the cli.
"""
