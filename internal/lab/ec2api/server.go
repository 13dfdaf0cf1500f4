package ec2api

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/xml"
	"net/http"
	"strconv"
	"strings"
)

// action is one Query API action.
type action struct {
	run func(*Server, form) (result, *apiError)
	// locked: run holds the server's lock throughout; the others (attach,
	// detach) take it in steps around their hooks.
	locked bool
	// dryRun: the action has a DryRun parameter (Assign and Unassign do
	// not, in the EC2 API model).
	dryRun bool
}

var actions = map[string]action{
	"DescribeInstances":               {run: (*Server).describeInstances, locked: true, dryRun: true},
	"DescribeInstanceTypes":           {run: (*Server).describeInstanceTypes, locked: true, dryRun: true},
	"DescribeSubnets":                 {run: (*Server).describeSubnets, locked: true, dryRun: true},
	"DescribeVpcs":                    {run: (*Server).describeVPCs, locked: true, dryRun: true},
	"DescribeSecurityGroups":          {run: (*Server).describeSecurityGroups, locked: true, dryRun: true},
	"DescribeNetworkInterfaces":       {run: (*Server).describeENIs, locked: true, dryRun: true},
	"DescribeTags":                    {run: (*Server).describeTags, locked: true, dryRun: true},
	"CreateNetworkInterface":          {run: (*Server).createENI, locked: true, dryRun: true},
	"AttachNetworkInterface":          {run: (*Server).attach, dryRun: true},
	"DetachNetworkInterface":          {run: (*Server).detach, dryRun: true},
	"DeleteNetworkInterface":          {run: (*Server).deleteENI, locked: true, dryRun: true},
	"ModifyNetworkInterfaceAttribute": {run: (*Server).modifyENI, locked: true, dryRun: true},
	"AssignPrivateIpAddresses":        {run: (*Server).assignPrivateIPs, locked: true},
	"UnassignPrivateIpAddresses":      {run: (*Server).unassignPrivateIPs, locked: true},
	"AssignIpv6Addresses":             {run: (*Server).assignIPv6, locked: true},
	"UnassignIpv6Addresses":           {run: (*Server).unassignIPv6, locked: true},
	"CreateTags":                      {run: (*Server).createTags, locked: true, dryRun: true},
	"DeleteTags":                      {run: (*Server).deleteTags, locked: true, dryRun: true},
	"TerminateInstances":              {run: (*Server).terminateInstances, locked: true, dryRun: true},
}

// Handler serves the Query API: POST / with a form body (a query string
// works too).
func (s *Server) Handler() http.Handler { return http.HandlerFunc(s.serve) }

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	reqID := newRequestID()
	r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
	if err := r.ParseForm(); err != nil {
		writeError(w, reqID, errorf(400, "MalformedQueryString", "The request could not be read: %v", err))
		return
	}
	f := form(r.Form)
	name := f.str("Action")
	a, known := actions[name]
	if !known {
		writeError(w, reqID, errorf(400, "InvalidAction", "The action %s is not valid for this web service.", name))
		return
	}
	if aerr := s.faults.admit(name, accessKeyID(r), unfilteredRequest(f)); aerr != nil {
		writeError(w, reqID, aerr)
		return
	}
	if dry, aerr := f.boolean("DryRun"); aerr != nil || dry {
		switch {
		case aerr != nil:
		case a.dryRun:
			aerr = errDryRun()
		default:
			aerr = errorf(400, "UnknownParameter", "The parameter DryRun is not recognized")
		}
		writeError(w, reqID, aerr)
		return
	}
	var res result
	var aerr *apiError
	if a.locked {
		s.mu.Lock()
		res, aerr = a.run(s, f)
		s.mu.Unlock()
	} else {
		res, aerr = a.run(s, f)
	}
	s.runHooks()
	if aerr != nil {
		writeError(w, reqID, aerr)
		return
	}
	if s.faults.loseReply(name) {
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				conn.Close()
				return
			}
		}
	}
	res.setRequestID(reqID)
	var buf bytes.Buffer
	buf.WriteString(xml.Header)
	start := xml.StartElement{Name: xml.Name{Space: xmlns, Local: name + "Response"}}
	if err := xml.NewEncoder(&buf).EncodeElement(res, start); err != nil {
		writeError(w, reqID, errorf(500, "InternalError", "encoding the answer: %v", err))
		return
	}
	write(w, 200, buf.Bytes())
}

// unfilteredRequest: no filter, no IDs, no pagination — the requests that
// take the smaller bucket of DescribeInstances, DescribeNetworkInterfaces
// and DescribeSecurityGroups. EC2's page speaks of "unfiltered and
// unpaginated"; IDs are counted as a filter here.
func unfilteredRequest(f form) bool {
	for k := range f {
		for _, p := range []string{"Filter.", "MaxResults", "NextToken", "InstanceId.", "NetworkInterfaceId.", "GroupId.", "GroupName."} {
			if strings.HasPrefix(k, p) {
				return false
			}
		}
	}
	return true
}

// accessKeyID reads the key ID from a SigV4 Authorization header
// ("AWS4-HMAC-SHA256 Credential=AKID/date/region/ec2/aws4_request, …").
// The signature itself is not checked: every key is accepted.
func accessKeyID(r *http.Request) string {
	_, cred, ok := strings.Cut(r.Header.Get("Authorization"), "Credential=")
	if !ok {
		return ""
	}
	id, _, _ := strings.Cut(cred, "/")
	return id
}

// textEscaper escapes XML text as EC2 does, leaving quotes as they are
// (encoding/xml would write ' as &#39;, which decoders accept but a reader
// of the raw answer does not expect).
var textEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;")

// writeError answers EC2's error envelope.
func writeError(w http.ResponseWriter, reqID string, e *apiError) {
	body := xml.Header + "<Response><Errors><Error><Code>" + textEscaper.Replace(e.code) + "</Code><Message>" +
		textEscaper.Replace(e.msg) + "</Message></Error></Errors><RequestID>" + reqID + "</RequestID></Response>"
	write(w, e.status, []byte(body))
}

func write(w http.ResponseWriter, status int, data []byte) {
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.Header().Set("Server", "AmazonEC2")
	w.WriteHeader(status)
	_, _ = w.Write(data)
}

func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
