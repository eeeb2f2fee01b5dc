package rollout_test

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/rollout"
)

// The table and the -json report say what happened to every server, the
// same story in both.
func TestReportTableAndJSON(t *testing.T) {
	f := newFleet(map[string]server{"s1": healthy(), "s2": healthy(), "s3": {release: "v1"}})
	f.deployFails["s2"] = true
	rep := rollout.Run(context.Background(), cfg(f, 1, "s1", "s2", "s3"))
	require.Equal(t, rollout.Failed, rep.Outcome)

	var table bytes.Buffer
	require.NoError(t, rep.WriteTable(&table))
	lines := bytes.Split(bytes.TrimSpace(table.Bytes()), []byte("\n"))
	require.Len(t, lines, 4, table.String())
	assert.Regexp(t, `^server\s+release before\s+release now\s+verified\s+what happened$`, string(lines[0]))
	// s3 was out, so it went first; s1 next; s2 failed, and all went back.
	assert.Regexp(t, `^s1\s+v1\s+v1\s+yes\s+deploy: verified and back in service; rollback: verified and back in service$`, string(lines[1]))
	assert.Regexp(t, `^s2\s+v1\s+v1\s+yes\s+deploy FAILED: deploy exit 1; rollback: verified and back in service$`, string(lines[2]))
	assert.Regexp(t, `^s3\s+v1\s+v1\s+yes\s+deploy: verified and back in service; rollback: verified and back in service$`, string(lines[3]))

	var js bytes.Buffer
	require.NoError(t, rep.WriteJSON(&js))
	var back rollout.Report
	require.NoError(t, json.Unmarshal(js.Bytes(), &back))
	assert.Equal(t, rep, back)
	assert.Contains(t, js.String(), `"outAtStart": true`)
}
