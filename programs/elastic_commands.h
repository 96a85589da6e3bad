/* elastic_commands.h: the subcommands of tp-elastic (programs/tp-elastic.c
 * dispatches on argv[1]); each takes argv from its own name on and returns
 * the exit status. */
#ifndef TP_PROGRAMS_ELASTIC_COMMANDS_H
#define TP_PROGRAMS_ELASTIC_COMMANDS_H

int elastic_plan_main(int argc, char **argv);   /* programs/elastic_plan.c */
int elastic_run_main(int argc, char **argv);    /* programs/elastic_run.c */
int elastic_report_main(int argc, char **argv); /* programs/elastic_report.c */

#endif
