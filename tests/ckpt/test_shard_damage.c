/* Damaged and hostile shard files (issue 11): the metadata checksum the
 * index records per shard is checked before libhdf5 parses the file, string
 * attributes are fixed-length, older checkpoints (variable-length strings,
 * no metadata checksum) still read, and links or storage reaching other
 * files are refused at commit and when reading. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../ckpt/ckpt.h"
#include "../support/fixture.h"

TestSuite(shard_damage, .init = make_dir, .fini = remove_dir);

static const char *const NAMES[2] = {"model/a.weight", "model/b.bias"};

/* Two tensors at tp=2: a split fp32 weight and a replicated bf16 bias. */
static void small_checkpoint(const char *path, int compress)
{
    ckpt_layout layout = {2, 1, 1, 2, 1};
    static uint8_t data[2][4096 * 4];
    for (size_t b = 0; b < sizeof data; b++) ((uint8_t *)data)[b] = (uint8_t)(b * 13 + 1);
    test_tensor t[2];
    memset(t, 0, sizeof t);
    strcpy(t[0].name, NAMES[0]);
    strcpy(t[1].name, NAMES[1]);
    t[0].desc = (ckpt_tensor_desc){.name = t[0].name, .dtype = TP_FP32, .ndim = 2, .shape = {64, 64},
                                   .anchor = CKPT_ANCHOR_LAYER, .layer = 1};
    t[0].desc.partition = (ckpt_partition){CKPT_SPLIT, 0, 0, {0}, 0, 0, 0};
    t[1].desc = (ckpt_tensor_desc){.name = t[1].name, .dtype = TP_BF16, .ndim = 1, .shape = {4096},
                                   .anchor = CKPT_ANCHOR_FIRST};
    t[0].logical = data[0];
    t[1].logical = data[1];
    write_tensors(path, &layout, t, 2, compress, 1);
}

/* A reader of path, with HDF5's checks or through the index alone
 * (ckpt_read_options.through_index). */
static int open_reader(ckpt_reader **r, const char *path, int through_index)
{
    ckpt_read_options options;
    ckpt_read_options_init(&options);
    options.through_index = through_index;
    return ckpt_reader_open(r, path, &options);
}

static int verify_read(const char *path, int through_index)
{
    ckpt_reader *r;
    int status = open_reader(&r, path, through_index);
    if (status) return status;
    for (int i = 0; !status && i < ckpt_reader_num_tensors(r); i++) {
        const ckpt_tensor_desc *d = ckpt_reader_tensor(r, i);
        for (int p = 0; !status && p < ckpt_piece_count(d, ckpt_reader_layout(r)->tp); p++)
            status = ckpt_reader_verify_piece(r, i, p);
    }
    ckpt_reader_close(r);
    return status;
}

/* Every piece read and verified twice: with HDF5's check of each file and
 * piece against the index, and through the index alone (tp-reshard's
 * ckpt_read_options.through_index; HDF5 again for checkpoints older than
 * 1.3). Both must refuse alike; tp_errmsg() is the second's. */
static int verify_all(const char *path)
{
    int with_hdf5 = verify_read(path, 0);
    char first[2048];
    snprintf(first, sizeof first, "%s", with_hdf5 ? tp_errmsg() : "ok");
    int through_index = verify_read(path, 1);
    cr_assert_eq(through_index, with_hdf5, "through the index: %d (%s); with HDF5: %d (%s)", through_index,
                 through_index ? tp_errmsg() : "ok", with_hdf5, first);
    return through_index;
}

static cJSON *load_index(const char *path)
{
    char file[700];
    snprintf(file, sizeof file, "%s/index.json", path);
    FILE *f = fopen(file, "rb");
    cr_assert(f);
    static char text[1 << 20];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    cJSON *root = cJSON_Parse(text);
    cr_assert(root);
    return root;
}

static void save_index(const char *path, cJSON *root)
{
    char file[700];
    snprintf(file, sizeof file, "%s/index.json", path);
    char *text = cJSON_Print(root);
    FILE *f = fopen(file, "wb");
    cr_assert(f && text);
    fputs(text, f);
    fclose(f);
    free(text);
    reseal_index(file); /* the deeper check must answer, not the index's seal */
}

static int64_t file_size(const char *file)
{
    struct stat st;
    cr_assert_eq(stat(file, &st), 0);
    return st.st_size;
}

static void poke(const char *file, long offset, unsigned char value)
{
    int fd = open(file, O_RDWR);
    cr_assert(fd >= 0);
    cr_assert_eq(pwrite(fd, &value, 1, offset), 1);
    close(fd);
}

static unsigned char peek(const char *file, long offset)
{
    int fd = open(file, O_RDONLY);
    unsigned char c = 0;
    cr_assert(fd >= 0);
    cr_assert_eq(pread(fd, &c, 1, offset), 1);
    close(fd);
    return c;
}

/* ------------------------------------------------- the index's new fields */

Test(shard_damage, index_records_metadata_checksum_and_extents)
{
    for (int compress = 0; compress <= 1; compress++) {
        char path[600], shard[700];
        snprintf(path, sizeof path, "%s/ck%d", dir, compress);
        small_checkpoint(path, compress ? 3 : 0);
        cJSON *root = load_index(path);
        cJSON *version = cJSON_GetObjectItem(root, "format_version");
        cr_assert_eq(cJSON_GetArrayItem(version, 0)->valueint, CKPT_FORMAT_MAJOR);
        cr_assert_geq(cJSON_GetArrayItem(version, 1)->valueint, 1, "format 1.1 or later");
        cJSON *f;
        cJSON_ArrayForEach(f, cJSON_GetObjectItem(root, "files"))
        {
            cJSON *sum = cJSON_GetObjectItem(f, "meta_checksum");
            cr_assert(cJSON_IsString(sum) && strlen(sum->valuestring) == 16, "meta_checksum recorded");
        }
        cJSON *t;
        cJSON_ArrayForEach(t, cJSON_GetObjectItem(root, "tensors"))
        {
            cJSON *p;
            const char *name = cJSON_GetObjectItem(t, "name")->valuestring;
            cJSON_ArrayForEach(p, cJSON_GetObjectItem(t, "pieces"))
            {
                snprintf(shard, sizeof shard, "%s/%s", path, cJSON_GetObjectItem(p, "file")->valuestring);
                hid_t file = H5Fopen(shard, H5F_ACC_RDONLY, H5P_DEFAULT);
                char dpath[300];
                snprintf(dpath, sizeof dpath, "/tensors/%s", name);
                hid_t d = H5Dopen2(file, dpath, H5P_DEFAULT);
                cr_assert(d >= 0);
                if (!compress) {
                    cr_assert_eq((int64_t)cJSON_GetObjectItem(p, "offset")->valuedouble, (int64_t)H5Dget_offset(d),
                                 "offset of %s", name);
                    cr_assert_eq(cJSON_GetObjectItem(p, "length")->valuedouble, cJSON_GetObjectItem(p, "bytes")->valuedouble);
                } else {
                    hsize_t chunks = 0;
                    hid_t space = H5Dget_space(d);
                    cr_assert(H5Dget_num_chunks(d, space, &chunks) >= 0);
                    cJSON *list = cJSON_GetObjectItem(p, "chunks");
                    cr_assert_eq(cJSON_GetArraySize(list), (int)chunks, "one extent per chunk of %s", name);
                    hsize_t offset[2];
                    unsigned mask;
                    haddr_t address;
                    hsize_t size;
                    cr_assert(H5Dget_chunk_info(d, space, 0, offset, &mask, &address, &size) >= 0);
                    H5Sclose(space);
                    cJSON *first = cJSON_GetArrayItem(list, 0);
                    cr_assert_eq((int64_t)cJSON_GetArrayItem(first, 0)->valuedouble, (int64_t)address);
                    cr_assert_eq((int64_t)cJSON_GetArrayItem(first, 1)->valuedouble, (int64_t)size);
                }
                H5Dclose(d);
                H5Fclose(file);
            }
        }
        cJSON_Delete(root);
        cr_assert_eq(verify_all(path), TP_OK, "%s", tp_errmsg());
    }
}

/* --------------------------------------------------- metadata checksum */

/* A byte HDF5 never looks at (free space between objects) and one it does
 * (the superblock's signature): both are reported as damaged metadata by
 * the checksum, before HDF5 opens the file, naming the file. */
Test(shard_damage, metadata_damage_detected_before_hdf5)
{
    char path[600], shard[700];
    snprintf(path, sizeof path, "%s/ck", dir);
    small_checkpoint(path, 0);
    snprintf(shard, sizeof shard, "%s/shard_pp00_tp01.h5", path);
    /* The last byte of the file lies after the last dataset's data: HDF5's
     * metadata or zero padding, never piece data. Find a zero byte of the
     * metadata area in the first 4 KiB instead, which is never data either. */
    long spare = -1;
    for (long o = 2048; o < 4096 && spare < 0; o++)
        if (peek(shard, o) == 0) spare = o;
    cr_assert(spare > 0);
    poke(shard, spare, 0x5a);
    cr_assert_eq(verify_all(path), TP_ERR_CHECKSUM, "%s", tp_errmsg());
    cr_assert(strstr(tp_errmsg(), "shard_pp00_tp01.h5") && strstr(tp_errmsg(), "metadata damaged") &&
                  strstr(tp_errmsg(), "index says"),
              "%s", tp_errmsg());
    poke(shard, spare, 0);
    cr_assert_eq(verify_all(path), TP_OK, "restored: %s", tp_errmsg());

    /* The superblock's signature: without the checksum HDF5 would refuse to
     * open the file (an HDF5 error); with it, the damage is a checksum error. */
    unsigned char saved = peek(shard, 1);
    poke(shard, 1, 'X');
    cr_assert_eq(verify_all(path), TP_ERR_CHECKSUM, "%s", tp_errmsg());
    cr_assert(strstr(tp_errmsg(), "metadata damaged"), "%s", tp_errmsg());
    poke(shard, 1, saved);

    /* A file of another size. */
    cr_assert_eq(truncate(shard, file_size(shard) + 1), 0);
    cr_assert_neq(verify_all(path), TP_OK);
    cr_assert(strstr(tp_errmsg(), "bytes") && strstr(tp_errmsg(), "shard_pp00_tp01.h5"), "%s", tp_errmsg());
}

/* Data damage is outside the metadata checksum: still reported per block
 * with tensor and rows, the other piece of the file intact. */
/* A shard file removed after the reader opened the checkpoint (a --keep
 * pruning it under the reader did): reported missing, as ckpt_reader_open
 * reports one missing at open, not "metadata damaged (size -1 bytes, ...)". */
Test(shard_damage, a_shard_file_gone_after_open_is_missing_not_damaged)
{
    for (int through_index = 0; through_index < 2; through_index++) {
        char path[600], shard[700];
        snprintf(path, sizeof path, "%s/ck%d", dir, through_index);
        small_checkpoint(path, 0);
        snprintf(shard, sizeof shard, "%s/shard_pp00_tp01.h5", path);
        ckpt_reader *r;
        cr_assert_eq(open_reader(&r, path, through_index), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(unlink(shard), 0);
        int status = TP_OK;
        for (int i = 0; !status && i < ckpt_reader_num_tensors(r); i++)
            for (int p = 0; !status && p < ckpt_piece_count(ckpt_reader_tensor(r, i), 2); p++)
                status = ckpt_reader_verify_piece(r, i, p);
        cr_assert_eq(status, TP_ERR_NOT_FOUND, "through_index %d: %d: %s", through_index, status, tp_errmsg());
        cr_assert(strstr(tp_errmsg(), "shard_pp00_tp01.h5: shard file missing") && !strstr(tp_errmsg(), "damaged"),
                  "through_index %d: %s", through_index, tp_errmsg());
        ckpt_reader_close(r);
    }
}

Test(shard_damage, data_damage_is_not_metadata_damage)
{
    char path[600], shard[700];
    snprintf(path, sizeof path, "%s/ck", dir);
    small_checkpoint(path, 0);
    cJSON *root = load_index(path);
    cJSON *piece = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "tensors"), 0), "pieces"), 1);
    long offset = (long)cJSON_GetObjectItem(piece, "offset")->valuedouble;
    snprintf(shard, sizeof shard, "%s/%s", path, cJSON_GetObjectItem(piece, "file")->valuestring);
    cJSON_Delete(root);
    poke(shard, offset + 10, (unsigned char)(peek(shard, offset + 10) ^ 0x40));
    for (int through_index = 0; through_index <= 1; through_index++) { /* with HDF5, and without */
        ckpt_reader *r;
        cr_assert_eq(open_reader(&r, path, through_index), TP_OK);
        int k = ckpt_reader_find(r, NAMES[0]);
        cr_assert_eq(ckpt_reader_verify_piece(r, k, 0), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(ckpt_reader_verify_piece(r, k, 1), TP_ERR_CHECKSUM);
        cr_assert(strstr(tp_errmsg(), NAMES[0]) && strstr(tp_errmsg(), "rows") && !strstr(tp_errmsg(), "metadata"),
                  "%s", tp_errmsg());
        ckpt_reader_close(r);
    }
}

/* ------------------------------------------------------ string attributes */

static void expect_fixed_string(hid_t obj, const char *name, const char *value)
{
    hid_t attr = H5Aopen(obj, name, H5P_DEFAULT);
    cr_assert(attr >= 0, "attribute %s", name);
    hid_t type = H5Aget_type(attr);
    cr_assert_eq(H5Tget_class(type), H5T_STRING);
    cr_assert_eq(H5Tis_variable_str(type), 0, "attribute %s is fixed-length", name);
    cr_assert_eq(H5Tget_cset(type), H5T_CSET_UTF8);
    char buf[300] = "";
    cr_assert(H5Tget_size(type) < sizeof buf);
    cr_assert(H5Aread(attr, type, buf) >= 0);
    cr_assert_str_eq(buf, value);
    H5Tclose(type);
    H5Aclose(attr);
}

Test(shard_damage, string_attributes_are_fixed_length)
{
    char path[600], shard[700];
    snprintf(path, sizeof path, "%s/ck", dir);
    small_checkpoint(path, 0);
    snprintf(shard, sizeof shard, "%s/shard_pp00_tp00.h5", path);
    hid_t f = H5Fopen(shard, H5F_ACC_RDONLY, H5P_DEFAULT);
    expect_fixed_string(f, "format", "tp-ckpt");
    hid_t d = H5Dopen2(f, "/tensors/model/a.weight", H5P_DEFAULT);
    expect_fixed_string(d, "name", "model/a.weight");
    expect_fixed_string(d, "role", "param");
    expect_fixed_string(d, "dtype", "fp32");
    expect_fixed_string(d, "anchor", "layer");
    expect_fixed_string(d, "partition", "split");
    H5Dclose(d);
    H5Fclose(f);
}

/* A name of the longest length: its fixed-length attribute (256 bytes with
 * the NUL) is read back at commit. */
Test(shard_damage, longest_name_round_trips)
{
    char path[600], name[CKPT_NAME_MAX + 1];
    snprintf(path, sizeof path, "%s/ck", dir);
    memset(name, 'x', CKPT_NAME_MAX);
    memcpy(name, "model/", 6);
    name[CKPT_NAME_MAX] = '\0';
    ckpt_layout layout = {1, 1, 1, 1, 1};
    static uint8_t data[16];
    test_tensor t;
    memset(&t, 0, sizeof t);
    t.desc = (ckpt_tensor_desc){.name = name, .dtype = TP_FP32, .ndim = 1, .shape = {4}, .anchor = CKPT_ANCHOR_FIRST};
    t.logical = data;
    write_tensors(path, &layout, &t, 1, 0, 1);
    ckpt_reader *r;
    cr_assert_eq(ckpt_reader_open(&r, path, NULL), TP_OK, "%s", tp_errmsg());
    cr_assert(ckpt_reader_find(r, name) >= 0);
    ckpt_reader_close(r);
    cr_assert_eq(verify_all(path), TP_OK, "%s", tp_errmsg());
}

/* ------------------------------------------------ older checkpoints (1.0) */

typedef struct {
    int rewritten;
} vlen_rewrite;

/* Rewrites one string attribute as a variable-length one, as format 1.0
 * wrote them. */
static herr_t to_vlen(hid_t obj, const char *name, const H5A_info_t *info, void *data)
{
    (void)info;
    vlen_rewrite *v = data;
    hid_t attr = H5Aopen(obj, name, H5P_DEFAULT);
    hid_t type = H5Aget_type(attr);
    int is_string = H5Tget_class(type) == H5T_STRING && H5Tis_variable_str(type) == 0;
    char value[300] = "";
    if (is_string) cr_assert(H5Aread(attr, type, value) >= 0);
    H5Tclose(type);
    H5Aclose(attr);
    if (!is_string) return 0;
    cr_assert(H5Adelete(obj, name) >= 0);
    hid_t vtype = H5Tcopy(H5T_C_S1), space = H5Screate(H5S_SCALAR);
    H5Tset_size(vtype, H5T_VARIABLE);
    H5Tset_cset(vtype, H5T_CSET_UTF8);
    hid_t nattr = H5Acreate2(obj, name, vtype, space, H5P_DEFAULT, H5P_DEFAULT);
    const char *p = value;
    cr_assert(nattr >= 0 && H5Awrite(nattr, vtype, &p) >= 0);
    H5Aclose(nattr);
    H5Sclose(space);
    H5Tclose(vtype);
    v->rewritten++;
    return 0;
}

static herr_t visit_to_vlen(hid_t obj, const char *name, const H5O_info_t *info, void *data)
{
    (void)info;
    hid_t o = H5Oopen(obj, name, H5P_DEFAULT);
    /* Deleting while iterating over the attributes is not allowed: collect
     * their names first. */
    char names[32][64];
    int n = 0;
    hsize_t count = 0;
    H5O_info_t oi;
    H5Oget_info2(o, &oi, H5O_INFO_NUM_ATTRS);
    count = oi.num_attrs;
    for (hsize_t k = 0; k < count && n < 32; k++)
        H5Aget_name_by_idx(o, ".", H5_INDEX_NAME, H5_ITER_INC, k, names[n++], 64, H5P_DEFAULT);
    for (int k = 0; k < n; k++) to_vlen(o, names[k], NULL, data);
    H5Oclose(o);
    return 0;
}

/* Turns a checkpoint into one of format 1.0: variable-length strings, and an
 * index without metadata checksums and extents. */
static void make_old(const char *path)
{
    DIR *d = opendir(path);
    struct dirent *e;
    int files = 0;
    while ((e = readdir(d))) {
        if (!strstr(e->d_name, ".h5")) continue;
        char shard[800];
        snprintf(shard, sizeof shard, "%s/%s", path, e->d_name);
        hid_t f = H5Fopen(shard, H5F_ACC_RDWR, H5P_DEFAULT);
        cr_assert(f >= 0);
        vlen_rewrite v = {0};
        cr_assert(H5Ovisit2(f, H5_INDEX_NAME, H5_ITER_NATIVE, visit_to_vlen, &v, H5O_INFO_BASIC) >= 0);
        cr_assert(v.rewritten > 5);
        H5Fclose(f);
        files++;
    }
    closedir(d);
    cr_assert_eq(files, 2);
    cJSON *root = load_index(path);
    cJSON *version = cJSON_GetObjectItem(root, "format_version");
    cJSON_ReplaceItemInArray(version, 1, cJSON_CreateNumber(0));
    cJSON *f;
    cJSON_ArrayForEach(f, cJSON_GetObjectItem(root, "files"))
    {
        cJSON_DeleteItemFromObject(f, "meta_checksum");
        char shard[800];
        snprintf(shard, sizeof shard, "%s/%s", path, cJSON_GetObjectItem(f, "name")->valuestring);
        cJSON_ReplaceItemInObject(f, "bytes", cJSON_CreateNumber((double)file_size(shard)));
    }
    cJSON *t;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(root, "tensors"))
    {
        cJSON *p;
        cJSON_ArrayForEach(p, cJSON_GetObjectItem(t, "pieces"))
        {
            cJSON_DeleteItemFromObject(p, "offset");
            cJSON_DeleteItemFromObject(p, "length");
            cJSON_DeleteItemFromObject(p, "chunks");
        }
    }
    save_index(path, root);
    cJSON_Delete(root);
}

Test(shard_damage, old_checkpoints_with_vlen_strings_read)
{
    for (int compress = 0; compress <= 1; compress++) {
        char path[600];
        snprintf(path, sizeof path, "%s/old%d", dir, compress);
        small_checkpoint(path, compress ? 3 : 0);
        make_old(path);
        ckpt_reader *r;
        cr_assert_eq(ckpt_reader_open(&r, path, NULL), TP_OK, "%s", tp_errmsg());
        int major, minor;
        ckpt_reader_version(r, &major, &minor);
        cr_assert_eq(minor, 0);
        int k = ckpt_reader_find(r, NAMES[0]);
        float buf[64 * 64];
        int64_t start[2] = {0, 0}, count[2] = {64, 64};
        cr_assert_eq(ckpt_reader_read_region(r, k, start, count, buf, sizeof buf), TP_OK, "%s", tp_errmsg());
        ckpt_reader_close(r);
        cr_assert_eq(verify_all(path), TP_OK, "%s", tp_errmsg());
    }
}

/* ----------------------------------------------- links to other files */

/* The index's size of a shard that grew, so that what is refused is its
 * content. */
static void fix_size(const char *path, int file, const char *shard)
{
    cJSON *root = load_index(path);
    cJSON *entry = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "files"), file);
    cJSON_ReplaceItemInObject(entry, "bytes", cJSON_CreateNumber((double)file_size(shard)));
    save_index(path, root);
    cJSON_Delete(root);
}

static void add_external_link(const char *shard, const char *target, const char *link)
{
    hid_t f = H5Fopen(shard, H5F_ACC_RDWR, H5P_DEFAULT);
    cr_assert(f >= 0);
    cr_assert(H5Lcreate_external(target, "/", f, link, H5P_DEFAULT, H5P_DEFAULT) >= 0);
    H5Fclose(f);
}

static void make_target(const char *file)
{
    hid_t f = H5Fcreate(file, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    cr_assert(f >= 0);
    H5Fclose(f);
}

/* An external link /tensors/model/evil to target added to the checkpoint's
 * shard_pp00_tp00.h5 (its path into shard), the index's size of the shard
 * fixed, so that what is refused is the link or the metadata. */
static void link_out_of_first_shard(const char *path, const char *target, char *shard, size_t shard_size)
{
    snprintf(shard, shard_size, "%s/shard_pp00_tp00.h5", path);
    add_external_link(shard, target, "/tensors/model/evil");
    fix_size(path, 0, shard);
}

Test(shard_damage, external_link_refused_when_reading)
{
    char path[600], shard[700], target[700];
    snprintf(path, sizeof path, "%s/old", dir);
    snprintf(target, sizeof target, "%s/elsewhere.h5", dir);
    make_target(target);
    small_checkpoint(path, 0);
    make_old(path); /* no metadata checksum: the links themselves must be refused */
    link_out_of_first_shard(path, target, shard, sizeof shard);
    cr_assert_eq(verify_all(path), TP_ERR_FORMAT, "%s", tp_errmsg());
    cr_assert(strstr(tp_errmsg(), "shard_pp00_tp00.h5") && strstr(tp_errmsg(), "external link") &&
                  strstr(tp_errmsg(), "tensors/model/evil"),
              "names file and link: %s", tp_errmsg());

    /* In a checkpoint of format 1.1 the added link is metadata damage. */
    snprintf(path, sizeof path, "%s/new", dir);
    small_checkpoint(path, 0);
    link_out_of_first_shard(path, target, shard, sizeof shard);
    cr_assert_eq(verify_all(path), TP_ERR_CHECKSUM, "%s", tp_errmsg());
    cr_assert(strstr(tp_errmsg(), "metadata damaged"), "%s", tp_errmsg());
}

/* A file of a current checkpoint whose index entry lost its metadata
 * checksum (the index sealed again): read through the index alone, nothing
 * would tie the file to the index, so it is opened with HDF5 all the same
 * and its added link refused there, by both ways of reading. */
Test(shard_damage, a_file_without_metadata_checksum_is_checked_with_hdf5)
{
    char path[600], shard[700], target[700];
    snprintf(path, sizeof path, "%s/ck", dir);
    snprintf(target, sizeof target, "%s/elsewhere.h5", dir);
    make_target(target);
    small_checkpoint(path, 0);
    link_out_of_first_shard(path, target, shard, sizeof shard);
    cJSON *root = load_index(path);
    cJSON_DeleteItemFromObject(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "files"), 0), "meta_checksum");
    save_index(path, root);
    cJSON_Delete(root);
    cr_assert_eq(verify_all(path), TP_ERR_FORMAT, "%s", tp_errmsg());
    cr_assert(strstr(tp_errmsg(), "external link") && strstr(tp_errmsg(), "tensors/model/evil"), "%s", tp_errmsg());
}

/* A dataset whose data lies in another file (HDF5 external storage). */
Test(shard_damage, external_storage_refused_when_reading)
{
    char path[600], shard[700], target[700];
    snprintf(path, sizeof path, "%s/old", dir);
    snprintf(target, sizeof target, "%s/raw.bin", dir);
    FILE *raw = fopen(target, "wb");
    fwrite("0123456789abcdef", 1, 16, raw);
    fclose(raw);
    small_checkpoint(path, 0);
    make_old(path);
    snprintf(shard, sizeof shard, "%s/shard_pp00_tp01.h5", path);
    hid_t f = H5Fopen(shard, H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    cr_assert(H5Pset_external(dcpl, target, 0, 16) >= 0);
    hsize_t dims[1] = {4};
    hid_t space = H5Screate_simple(1, dims, NULL);
    hid_t d = H5Dcreate2(f, "/checksums/stolen", H5T_STD_U32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    cr_assert(d >= 0);
    H5Dclose(d);
    H5Sclose(space);
    H5Pclose(dcpl);
    H5Fclose(f);
    fix_size(path, 1, shard);
    cr_assert_eq(verify_all(path), TP_ERR_FORMAT, "%s", tp_errmsg());
    cr_assert(strstr(tp_errmsg(), "shard_pp00_tp01.h5") && strstr(tp_errmsg(), "external files") &&
                  strstr(tp_errmsg(), "checksums/stolen"),
              "%s", tp_errmsg());
}

/* A checkpoint of one fp32 tensor model/x [4] at tp 1, written by a
 * distributed writer and left staged (not committed): the path of its
 * staged shard, .ck.<owner>.staging/shard_pp00_tp00.h5, in shard. */
static void stage_one_tensor(const char *path, const ckpt_layout *layout, char *shard, size_t shard_size)
{
    ckpt_write_options options;
    ckpt_write_options_init(&options);
    cr_assert_eq(ckpt_stage_prepare(path, &options), TP_OK, "%s", tp_errmsg());
    options.shard_pp = 0;
    options.shard_tp = 0;
    ckpt_writer *w;
    cr_assert_eq(ckpt_writer_create(&w, path, layout, &options), TP_OK, "%s", tp_errmsg());
    ckpt_tensor_desc desc = {.name = "model/x", .dtype = TP_FP32, .ndim = 1, .shape = {4},
                             .anchor = CKPT_ANCHOR_FIRST};
    int id;
    float values[4] = {1, 2, 3, 4};
    cr_assert_eq(ckpt_writer_add_tensor(w, &desc, &id), TP_OK);
    cr_assert_eq(ckpt_writer_put_piece(w, id, 0, values), TP_OK);
    cr_assert_eq(ckpt_writer_finish(w), TP_OK, "%s", tp_errmsg());
    DIR *d = opendir(dir);
    struct dirent *e;
    shard[0] = '\0';
    while ((e = readdir(d)))
        if (strncmp(e->d_name, ".ck.", 4) == 0 && strstr(e->d_name, ".staging"))
            snprintf(shard, shard_size, "%s/%s/shard_pp00_tp00.h5", dir, e->d_name);
    closedir(d);
    cr_assert(shard[0], "staged shard found");
}

/* The commit scans every staged shard: a link there is refused and nothing
 * is published. */
Test(shard_damage, external_link_refused_at_commit)
{
    char path[600], target[700];
    snprintf(path, sizeof path, "%s/ck", dir);
    snprintf(target, sizeof target, "%s/elsewhere.h5", dir);
    make_target(target);
    ckpt_layout layout = {1, 1, 1, 1, 1};
    char shard[1400];
    stage_one_tensor(path, &layout, shard, sizeof shard);
    add_external_link(shard, target, "/elsewhere");
    ckpt_write_options options;
    ckpt_write_options_init(&options);
    cr_assert_eq(ckpt_commit_staged(path, &layout, NULL, &options), TP_ERR_FORMAT, "%s", tp_errmsg());
    cr_assert(strstr(tp_errmsg(), "shard_pp00_tp00.h5") && strstr(tp_errmsg(), "external link /elsewhere"),
              "names file and link: %s", tp_errmsg());
    cr_assert_eq(access(path, F_OK), -1, "nothing published");
}

static herr_t copy_attribute(hid_t from, const char *name, const H5A_info_t *info, void *to)
{
    (void)info;
    hid_t a = H5Aopen(from, name, H5P_DEFAULT);
    hid_t type = H5Aget_type(a), space = H5Aget_space(a);
    size_t bytes = (size_t)H5Aget_storage_size(a);
    void *buf = calloc(1, bytes ? bytes : 1);
    hid_t b = H5Acreate2(*(hid_t *)to, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    herr_t ok = a >= 0 && b >= 0 && buf && H5Aread(a, type, buf) >= 0 && H5Awrite(b, type, buf) >= 0 ? 0 : -1;
    free(buf);
    H5Aclose(b);
    H5Sclose(space);
    H5Tclose(type);
    H5Aclose(a);
    return ok;
}

/* A staged piece whose dataset is stored as another type than its dtype
 * (every attribute the writer gave it, int32 in place of fp32) is refused
 * by the commit: readers through the index alone take the dtype from the
 * index and never ask HDF5. */
Test(shard_damage, a_dataset_of_another_type_than_its_dtype_is_refused_at_commit)
{
    char path[600];
    snprintf(path, sizeof path, "%s/ck", dir);
    ckpt_layout layout = {1, 1, 1, 1, 1};
    char shard[1400];
    stage_one_tensor(path, &layout, shard, sizeof shard);
    /* The dataset replaced by an int32 one of the same shape and attributes,
     * its space allocated at once (a file offset, as the writer's have). */
    hid_t f = H5Fopen(shard, H5F_ACC_RDWR, H5P_DEFAULT);
    cr_assert(f >= 0);
    cr_assert(H5Lmove(f, "/tensors/model/x", f, "/tensors/model/x_fp32", H5P_DEFAULT, H5P_DEFAULT) >= 0);
    hid_t old = H5Dopen2(f, "/tensors/model/x_fp32", H5P_DEFAULT);
    hid_t space = H5Dget_space(old), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    cr_assert(H5Pset_layout(dcpl, H5D_CONTIGUOUS) >= 0 && H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY) >= 0);
    hid_t other = H5Dcreate2(f, "/tensors/model/x", H5T_STD_I32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    cr_assert(other >= 0);
    cr_assert(H5Aiterate2(old, H5_INDEX_NAME, H5_ITER_NATIVE, NULL, copy_attribute, &other) >= 0);
    H5Dclose(other);
    H5Pclose(dcpl);
    H5Sclose(space);
    H5Dclose(old);
    cr_assert(H5Ldelete(f, "/tensors/model/x_fp32", H5P_DEFAULT) >= 0);
    H5Fclose(f);
    ckpt_write_options options;
    ckpt_write_options_init(&options);
    cr_assert_eq(ckpt_commit_staged(path, &layout, NULL, &options), TP_ERR_FORMAT, "%s", tp_errmsg());
    cr_assert(strstr(tp_errmsg(), "shard_pp00_tp00.h5") && strstr(tp_errmsg(), "model/x") &&
                  strstr(tp_errmsg(), "dataset type is not its dtype fp32"),
              "%s", tp_errmsg());
    cr_assert_eq(access(path, F_OK), -1, "nothing published");
}

/* ckpt_read_options.damaged_files_fail_pieces: a missing and a cut-short
 * file fail their own pieces, with the message the open gave before, and
 * ckpt_verify reports both; the default still fails the open at the first. */
Test(shard_damage, damaged_files_fail_their_pieces_when_asked)
{
    char path[600], missing[700], short_file[700];
    snprintf(path, sizeof path, "%s/ck", dir);
    small_checkpoint(path, 0);
    snprintf(missing, sizeof missing, "%s/shard_pp00_tp00.h5", path);
    snprintf(short_file, sizeof short_file, "%s/shard_pp00_tp01.h5", path);
    cr_assert_eq(unlink(missing), 0);
    cr_assert_eq(truncate(short_file, file_size(short_file) - 100), 0);

    ckpt_reader *r = NULL;
    cr_assert_eq(open_reader(&r, path, 0), TP_ERR_NOT_FOUND, "the default open fails at the first: %s", tp_errmsg());

    ckpt_read_options options;
    ckpt_read_options_init(&options);
    options.damaged_files_fail_pieces = 1;
    cr_assert_eq(ckpt_reader_open(&r, path, &options), TP_OK, "%s", tp_errmsg());
    ckpt_verify_result result;
    cr_assert_eq(ckpt_verify(r, NULL, &result), TP_OK, "%s", tp_errmsg());
    /* The weight's two pieces, one a file, and the replicated bias's one,
     * in tp rank 0's file: all three damaged. */
    cr_assert_eq(result.pieces, 3);
    cr_assert_eq(result.damaged, 3, "%lld damaged", (long long)result.damaged);
    int said_missing = 0, said_short = 0;
    for (int i = 0; i < result.damaged; i++) {
        const char *m = result.damage[i].message;
        if (strstr(m, "shard_pp00_tp00.h5: shard file missing")) said_missing++;
        if (strstr(m, "shard_pp00_tp01.h5") && strstr(m, "the index records")) said_short++;
    }
    cr_assert(said_missing == 2 && said_short == 1, "missing %d of 2 pieces, cut short %d of 1", said_missing, said_short);
    ckpt_verify_result_free(&result);
    ckpt_reader_close(r);
}
