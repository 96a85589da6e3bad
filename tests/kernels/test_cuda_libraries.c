/* The search for cuBLAS and NCCL (kernels/cuda/libraries.h), on a machine
 * without either: a real shared library (this process's libzstd) copied
 * under a made-up name into a made-up toolkit, a made-up PyTorch virtual
 * environment and a directory named in TP_CUDA_LIBRARY_PATH. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../../common/error.h"
#include "../../kernels/cuda/libraries.h"
#include "../support/fixture.h"

static const char *const fake_names[] = {"libtpfake.so.7", "libtpfake.so"};

/* The path of the libzstd this process loaded. */
static int find_zstd(struct dl_phdr_info *info, size_t size, void *out)
{
    (void)size;
    if (!strstr(info->dlpi_name, "libzstd.so")) return 0;
    snprintf(out, 512, "%s", info->dlpi_name);
    return 1;
}

static void make_dirs(const char *path)
{
    char copy[1024];
    snprintf(copy, sizeof copy, "%s", path);
    for (char *p = copy + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        mkdir(copy, 0755);
        *p = '/';
    }
    mkdir(copy, 0755);
}

/* Writes DIR/NAME: a copy of a real library, or garbage. */
static void put_library(const char *subdir, const char *name, int real)
{
    char directory[1024], path[1100], zstd[512] = "";
    snprintf(directory, sizeof directory, "%s/%s", dir, subdir);
    make_dirs(directory);
    snprintf(path, sizeof path, "%s/%s", directory, name);
    FILE *out = fopen(path, "wb");
    cr_assert(out, "cannot create %s", path);
    if (real) {
        dl_iterate_phdr(find_zstd, zstd);
        cr_assert(zstd[0], "this test program has no libzstd loaded");
        FILE *in = fopen(zstd, "rb");
        cr_assert(in, "cannot read %s", zstd);
        char buffer[65536];
        size_t n;
        while ((n = fread(buffer, 1, sizeof buffer, in)) > 0) cr_assert_eq(fwrite(buffer, 1, n, out), n);
        fclose(in);
    } else {
        fputs("not a shared library\n", out);
    }
    cr_assert_eq(fclose(out), 0);
}

/* An empty environment for the search: a PATH with only a made-up python3. */
static void isolate(void)
{
    make_dir();
    unsetenv("CUDA_HOME");
    unsetenv("CUDA_PATH");
    unsetenv("VIRTUAL_ENV");
    unsetenv("CONDA_PREFIX");
    unsetenv("TP_CUDA_LIBRARY_PATH");
    char bin[1024], python[1100];
    snprintf(bin, sizeof bin, "%s/venv/bin", dir);
    make_dirs(bin);
    snprintf(python, sizeof python, "%s/python3", bin);
    FILE *f = fopen(python, "w");
    cr_assert(f);
    fclose(f);
    chmod(python, 0755);
    setenv("PATH", bin, 1);
}

TestSuite(cuda_libraries, .init = isolate, .fini = remove_dir);

static void expect_found_in(const char *subdir)
{
    void *library = NULL;
    char found_in[1024], expected[1024];
    cr_assert_eq(cuda_library_open("Fake", fake_names, 2, &library, found_in, sizeof found_in), TP_OK, "%s",
                 tp_errmsg());
    cr_assert(library);
    cr_assert(dlsym(library, "ZSTD_versionNumber"), "the library loaded is not the copy");
    snprintf(expected, sizeof expected, "%s/%s", dir, subdir);
    cr_assert_str_eq(found_in, expected);
    dlclose(library);
}

Test(cuda_libraries, found_in_pytorchs_wheels_by_the_python_on_path)
{
    put_library("venv/lib/python3.12/site-packages/nvidia/cu13/lib", "libtpfake.so.7", 1);
    expect_found_in("venv/lib/python3.12/site-packages/nvidia/cu13/lib");
}

Test(cuda_libraries, the_toolkit_comes_before_the_wheels)
{
    put_library("venv/lib/python3.12/site-packages/nvidia/cublas/lib", "libtpfake.so.7", 1);
    put_library("cuda/lib64", "libtpfake.so.7", 1);
    char home[1024];
    snprintf(home, sizeof home, "%s/cuda", dir);
    setenv("CUDA_HOME", home, 1);
    expect_found_in("cuda/lib64");
}

Test(cuda_libraries, the_environment_comes_last)
{
    char other[2048];
    snprintf(other, sizeof other, "%s/nowhere:%s/other", dir, dir);
    setenv("TP_CUDA_LIBRARY_PATH", other, 1);
    put_library("other", "libtpfake.so", 1);
    expect_found_in("other");
    put_library("venv/lib/python3.12/site-packages/nvidia/nccl/lib", "libtpfake.so", 1);
    expect_found_in("venv/lib/python3.12/site-packages/nvidia/nccl/lib");
}

Test(cuda_libraries, a_virtual_environment_named_in_the_environment)
{
    put_library("env2/lib/python3.11/site-packages/nvidia/cu13/lib", "libtpfake.so.7", 1);
    char env[1024];
    snprintf(env, sizeof env, "%s/env2", dir);
    setenv("VIRTUAL_ENV", env, 1);
    expect_found_in("env2/lib/python3.11/site-packages/nvidia/cu13/lib");
}

Test(cuda_libraries, absence_names_every_place_looked_in)
{
    char home[1024], pattern[1100];
    snprintf(home, sizeof home, "%s/cuda", dir);
    setenv("CUDA_HOME", home, 1);
    void *library = NULL;
    cr_assert_eq(cuda_library_open("Fake", fake_names, 2, &library, NULL, 0), TP_ERR_DEVICE);
    cr_assert_null(library);
    const char *message = tp_errmsg();
    cr_assert(strstr(message, "Fake (libtpfake.so.7) not found"), "%s", message);
    snprintf(pattern, sizeof pattern, "%s/cuda/lib64", dir);
    cr_assert(strstr(message, pattern), "%s", message);
    cr_assert(strstr(message, "the loader's path"), "%s", message);
    snprintf(pattern, sizeof pattern, "%s/venv/lib/python3*/site-packages/nvidia/*/lib", dir);
    cr_assert(strstr(message, pattern), "%s", message);
    cr_assert(strstr(message, "TP_CUDA_LIBRARY_PATH (not set)"), "%s", message);
}

Test(cuda_libraries, a_copy_that_does_not_load_is_named_with_the_reason)
{
    char other[1024];
    snprintf(other, sizeof other, "%s/broken", dir);
    setenv("TP_CUDA_LIBRARY_PATH", other, 1);
    put_library("broken", "libtpfake.so.7", 0);
    void *library = NULL;
    cr_assert_eq(cuda_library_open("Fake", fake_names, 2, &library, NULL, 0), TP_ERR_DEVICE);
    const char *message = tp_errmsg();
    cr_assert(strstr(message, "Fake (libtpfake.so.7) was found but does not load"), "%s", message);
    cr_assert(strstr(message, "broken/libtpfake.so.7"), "%s", message);
}

/* The functions of a loaded library, into their fields in order; the first
 * missing one named, with the library, and the fields from it on left as
 * they were. */
Test(cuda_libraries, symbols_each_found_or_the_first_missing_named)
{
    void *library = dlopen(NULL, RTLD_NOW); /* this program and what it loaded: libzstd among them */
    cr_assert(library, "%s", dlerror());
    void *version = NULL, *compress = NULL, *missing = (void *)&version, *after = (void *)&compress;
    const cuda_library_symbol found[] = {{"ZSTD_versionNumber", &version}, {"ZSTD_compress", &compress}};
    cr_assert_eq(cuda_library_symbols(library, "zstd", "this process", found, 2), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(version, dlsym(library, "ZSTD_versionNumber"));
    cr_assert_eq(compress, dlsym(library, "ZSTD_compress"));
    void *first = NULL;
    const cuda_library_symbol some[] = {
        {"ZSTD_versionNumber", &first}, {"tp_no_such_function", &missing}, {"ZSTD_compress", &after}};
    cr_assert_eq(cuda_library_symbols(library, "zstd", "this process", some, 3), TP_ERR_DEVICE);
    cr_assert_str_eq(tp_errmsg(), "zstd (this process) has no tp_no_such_function");
    cr_assert_eq(first, version, "the one before the missing one is set");
    cr_assert_eq(missing, (void *)&version, "the missing one's field is left as it was");
    cr_assert_eq(after, (void *)&compress, "and so is the one after it");
    dlclose(library);
}
