/* tp_fail_context (common/error.c): context put in front of a failure's
 * message, and a file the message names already said once, not twice
 * ("P: tensor T: P: cannot write" was what a full disk under a writer that
 * adds its file and tensor read as). */
#include <criterion/criterion.h>
#include <string.h>

#include "../../common/error.h"

Test(error, context_goes_in_front)
{
    cr_assert_eq(tp_fail(TP_ERR_IO, "cannot write: %s", "No space left on device"), TP_ERR_IO);
    cr_assert_eq(tp_fail_context(TP_ERR_IO, "a.h5"), TP_ERR_IO);
    cr_assert_str_eq(tp_errmsg(), "a.h5: cannot write: No space left on device");
}

Test(error, the_file_the_message_names_is_said_once)
{
    tp_fail(TP_ERR_IO, "out/__0_0.distcp: cannot write: File too large");
    tp_fail_context(TP_ERR_IO, "out/__0_0.distcp: tensor %s", "model/wte");
    cr_assert_str_eq(tp_errmsg(), "out/__0_0.distcp: tensor model/wte: cannot write: File too large");
    tp_fail(TP_ERR_IO, "iter/model_optim_rng.pt: cannot write: File too large");
    tp_fail_context(TP_ERR_IO, "%s", "iter/model_optim_rng.pt");
    cr_assert_str_eq(tp_errmsg(), "iter/model_optim_rng.pt: cannot write: File too large");
}

Test(error, another_file_keeps_both)
{
    tp_fail(TP_ERR_FORMAT, "b.h5: damaged");
    tp_fail_context(TP_ERR_FORMAT, "a.h5: tensor t");
    cr_assert_str_eq(tp_errmsg(), "a.h5: tensor t: b.h5: damaged");
    /* A name that merely starts the same is another file. */
    tp_fail(TP_ERR_FORMAT, "a.h5.bak: damaged");
    tp_fail_context(TP_ERR_FORMAT, "a.h5");
    cr_assert_str_eq(tp_errmsg(), "a.h5: a.h5.bak: damaged");
}
