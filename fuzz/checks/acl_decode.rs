//! The POSIX ACL xattr decoder: it must never panic, and whatever it accepts must survive
//! encode → decode unchanged (and encode to the same bytes again).

use agentworks_workspace::acl::Acl;

pub fn run(data: &[u8]) {
    let Ok(acl) = Acl::decode(data) else {
        return;
    };
    let bytes = acl.encode();
    let again = Acl::decode(&bytes).expect("an encoded ACL decodes");
    assert_eq!(again, acl, "decode → encode → decode is not the identity");
    assert_eq!(again.encode(), bytes, "encoding is not canonical");
    assert!(
        Acl::from_entries(acl.entries().to_vec()).is_ok(),
        "decoded entries do not validate"
    );
}
