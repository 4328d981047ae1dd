/* llmem: umbrella header. */
#ifndef LLMEM_H
#define LLMEM_H
#include "llmem/status.h"
#include "llmem/backend.h"
#include "llmem/batch.h"
#include "llmem/memory.h"
#include "llmem/kv_cache.h"
#include "llmem/recurrent.h"
#include "llmem/hybrid.h"
#include "llmem/comm.h"
#include "llmem/tokenizer.h"
#include "llmem/chat_template.h"
#define LLMEM_VERSION_STRING "0.1.0"
#endif
