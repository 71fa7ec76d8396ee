from ioe.entry import main

main()
