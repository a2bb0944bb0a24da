from seedflood.cli import console

console()
