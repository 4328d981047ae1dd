/* llmem: chat templates (stub; the implementation lands next). */
#include <stdio.h>
#include <stdlib.h>

#include "llmem/chat_template.h"

llmem_status llmem_chat_template_create(const char *source, llmem_chat_template **out,
                                        char *err, size_t err_len)
{
    if (out)
        *out = NULL;
    if (!source || !out)
        return LLMEM_E_INVALID;
    if (err && err_len)
        snprintf(err, err_len, "chat template: not implemented yet");
    return LLMEM_E_UNSUPPORTED;
}

void llmem_chat_template_destroy(llmem_chat_template *tmpl) { (void)tmpl; }

llmem_status llmem_chat_template_render(const llmem_chat_template *tmpl,
                                        const llmem_chat_message *msgs, size_t n_msgs,
                                        bool add_generation_prompt, const char *bos_token,
                                        const char *eos_token, char **out, size_t *out_len,
                                        char *err, size_t err_len)
{
    if (out)
        *out = NULL;
    return LLMEM_E_UNSUPPORTED;
}

llmem_status llmem_chat_template_render_json(const llmem_chat_template *tmpl,
                                             const char *context_json, char **out,
                                             size_t *out_len, char *err, size_t err_len)
{
    if (out)
        *out = NULL;
    return LLMEM_E_UNSUPPORTED;
}
