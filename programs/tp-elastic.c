/* tp-elastic: keeps a training run going through failures and changes of
 * capacity (docs/ELASTIC.md). A thin dispatcher: each subcommand lives in
 * programs/elastic_<name>.c over the elastic library. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "elastic_commands.h"

static const char usage[] =
    "usage: tp-elastic run --ckpt-dir DIR [options] -- tp-train ARGS...   train, relaunching through failures\n"
    "       tp-elastic plan --world N (--ckpt DIR | model flags) --global-batch B [options]   valid layouts\n"
    "       tp-elastic report RUN_DIR -o report.svg|png                     loss curve and summary of a run\n"
    "Run `tp-elastic COMMAND --help` for a command's options.\n";

int main(int argc, char **argv)
{
    cli_print_store_notices("tp-elastic");
    cli_check_stdout_at_exit("tp-elastic");
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "run") == 0) return elastic_run_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "plan") == 0) return elastic_plan_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "report") == 0) return elastic_report_main(argc - 1, argv + 1);
    fprintf(stderr, "tp-elastic: unknown command '%s' (see tp-elastic --help)\n", argv[1]);
    return 2;
}
