from pipeline.cli import main
from pipeline.core.quick_exit import quick_exit

quick_exit(main())
