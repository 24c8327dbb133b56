package testenv

import (
	"testing"

	"github.com/ortbus/ortbus/internal/llmtenant"
)

// RequireLLMTenant is what a test of the LLM tenant needs: node, tenants/llm/tenant.mjs
// and node-llama-cpp installed by `make llm-tenant` (.deps/llm-tenant). Where one is
// missing, t is skipped saying what and how to install it — or failed under CI (CI set),
// where `make test` installs it first: there the tenant must run, never skip. It returns
// the tenant's Options with Script and Modules set (the caller sets Model).
func RequireLLMTenant(t testing.TB) llmtenant.Options {
	t.Helper()
	repo := RepoRoot(t)
	if why := llmtenant.Missing(repo); why != "" {
		skipOrFailBecause(t, "the LLM tenant cannot run: "+why)
	}
	return llmtenant.Options{Script: llmtenant.Script(repo), Modules: llmtenant.Modules(repo)}
}
