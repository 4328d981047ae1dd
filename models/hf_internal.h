/* llmem models/: helpers shared by the checkpoint loader files. */
#ifndef LLMEM_MODELS_HF_INTERNAL_H
#define LLMEM_MODELS_HF_INTERNAL_H

#include <stddef.h>

#include "llmem/status.h" /* llmem_errf, the one error formatter */

/* Largest integer a JSON number (an IEEE double) holds exactly: 2^53. */
#define HF_JSON_INT_MAX 9007199254740992.0

#endif
