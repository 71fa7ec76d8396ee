from ioe.cli import main

main()
