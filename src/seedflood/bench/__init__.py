"""The figures we publish (docs/design.md §11): one program per figure and the wire-cost counter.

May import: every other seedflood package except the cli.
"""
