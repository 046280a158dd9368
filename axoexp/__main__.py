from axoexp.cli import main

main()
