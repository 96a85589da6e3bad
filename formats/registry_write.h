/* registry_write.h (private to formats/): the built-in formats' writers,
 * which registry.c's table names. */
#ifndef TP_FORMATS_REGISTRY_WRITE_H
#define TP_FORMATS_REGISTRY_WRITE_H

#include "registry.h"

extern const formats_writer formats_own_writer;
extern const formats_writer formats_megatron_writer;
extern const formats_writer formats_torch_dist_writer;
extern const formats_writer formats_dcp_writer;

#endif
