from ampfix.cli import main

main()
