package deploy_test

import (
	"path"
	"testing"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/require"
)

// TestMailpitKeepsItsEmails: Mailpit stores the emails in the file
// MP_DATABASE names (https://mailpit.axllent.org/docs/configuration/runtime-options/),
// on a named volume, so `docker compose down` then `up` keeps them beside
// the orders they are about; without MP_DATABASE it holds them in memory.
func TestMailpitKeepsItsEmails(t *testing.T) {
	t.Parallel()
	p := loadProject(t)
	s, err := p.GetService("mailpit")
	require.NoError(t, err)
	db := env(s)["MP_DATABASE"]
	require.NotEmpty(t, db, "mailpit: MP_DATABASE")
	found := false
	for _, v := range s.Volumes {
		if v.Target != path.Dir(db) {
			continue
		}
		found = true
		require.Equal(t, types.VolumeTypeVolume, v.Type, "mailpit: %s is not a named volume", v.Target)
		decl, ok := p.Volumes[v.Source]
		require.True(t, ok, "volume %q is declared", v.Source)
		require.False(t, bool(decl.External), "`down -v` removes it")
	}
	require.True(t, found, "mailpit: no named volume on %s", path.Dir(db))
}
