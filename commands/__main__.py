from commands.console import main

main()
